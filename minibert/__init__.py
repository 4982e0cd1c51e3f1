"""minibert: a from-scratch, minimal-dependency BERT in pure PyTorch.

    >>> import minibert
    >>> model = minibert.BertForMaskedLM(minibert.BertConfig.preset("tiny", vocab_size=1000))
    >>> minibert.train(model, dataset, collate, minibert.TrainConfig(max_steps=100), "runs/x")

The names below are imported from their modules on first use (PEP 562 `__getattr__`), so
`import minibert.model.model` loads the model's files and nothing of the training engine or the
data pipeline (tests/test_layout.py); `minibert.train` loads the engine when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# the module that defines them -> the public names
_MODULES = {
    "model.config": ["BertConfig"],
    "model.model": ["BertModel", "BertOutput", "ModelOutput"],
    "model.heads": ["BertForMaskedLM", "BertForSequenceClassification",
                    "BertForTokenClassification", "BertForQuestionAnswering", "MaskedLMOutput",
                    "SequenceClassifierOutput", "TokenClassifierOutput",
                    "QuestionAnsweringModelOutput"],
    "tasks.multitask": ["BertMultiTask"], "tasks.sentence": ["SentenceEncoder"],
    "data.tokenizer": ["Tokenizer"], "machine.swap": ["fast"], "training.rng": ["set_seed"],
    "training.engine": ["train"], "training.state": ["TrainConfig"],
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
