"""A training checkpoint (`checkpoints/step_N`) turned into a model folder.

`export_checkpoint` rebuilds the model class a checkpoint of the training loop holds and saves
it with `save_pretrained`, so it loads with `from_pretrained` (and in transformers, for
BERT's and ModernBERT's architectures: `BertConfig.model_type`).
It sits above the model and its heads, which it builds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from torch import Tensor

from . import heads
from .checkpoint import STATE_FILE, load_checkpoint
from .config import BertConfig
from .hf import PathLike, check_finite, error_gist
from .model import BertModel

EXPORTABLE = ("BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
              "BertForQuestionAnswering", "BertModel")


def export_checkpoint(checkpoint_dir: PathLike, out_dir: PathLike,
                      model_class: Optional[str] = None) -> Path:
    """Write the model of a training checkpoint (`checkpoints/step_N`) as a model folder.

    The class is `model_class`, else the one the checkpoint records, else the one its weight
    names show (older checkpoints, see `_class_from_names`). A classifier's number of labels
    comes from its weights, its class names from the checkpoint (LABEL_i where it has none).
    The folder loads with `from_pretrained` (and, for Post-LN, in transformers). Returns it.
    """
    checkpoint_dir = Path(checkpoint_dir)
    state = load_checkpoint(checkpoint_dir)  # verified against meta.json, read weights-only
    weights, config = state.get("model"), state.get("model_config")
    if not isinstance(weights, dict) or not isinstance(config, dict):
        raise ValueError(f"checkpoint {checkpoint_dir} has no 'model' and 'model_config' "
                         f"entries; export handles checkpoints of minibert's training loop")
    # A model folder of NaN weights would only be refused where it is loaded.
    check_finite(weights, checkpoint_dir / STATE_FILE,
                 fix="export an earlier checkpoint of the run, from before it diverged")
    name = model_class or state.get("model_class") or _class_from_names(weights, config)
    if name not in EXPORTABLE:
        raise ValueError(f"model_class={name!r} is not one of {EXPORTABLE}")
    try:
        bert_config = BertConfig(**config)
    except TypeError as e:
        raise ValueError(f"checkpoint {checkpoint_dir}: its model_config does not fit this "
                         f"minibert's BertConfig ({e})") from None
    kwargs = {}
    if name in ("BertForSequenceClassification", "BertForTokenClassification") and \
            "classifier.weight" in weights:
        kwargs["num_labels"] = weights["classifier.weight"].shape[0]  # (C, H)
        names = state.get("id2label")
        if names and len(names) == kwargs["num_labels"]:
            kwargs["id2label"] = names
    model = (BertModel if name == "BertModel" else getattr(heads, name))(bert_config, **kwargs)
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if missing or unexpected:
        raise ValueError(f"checkpoint {checkpoint_dir} does not hold a {name} (missing "
                         f"{missing[:2]}, unexpected {unexpected[:2]}); pass model_class= "
                         f"one of {EXPORTABLE}")
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        raise ValueError(f"checkpoint {checkpoint_dir}: its weights do not fit its "
                         f"model_config ({error_gist(e)})") from None
    model.save_pretrained(out_dir)
    return Path(out_dir)


def _class_from_names(weights: dict[str, Tensor], config: dict) -> str:
    """The model class a minibert state dict belongs to, from its parameter names.

    The two classifiers share the name `classifier.`; with BERT's heads they differ in the
    pooler, which the sequence classifier has (its input is the pooled [CLS]) and the token
    classifier never has (as in transformers). With task_head="transform" neither has one,
    and the names cannot tell them apart: the caller must say.
    """
    if any(k.startswith("qa_outputs.") for k in weights):
        return "BertForQuestionAnswering"
    if any(k.startswith("classifier.") for k in weights):
        if config.get("task_head", "bert") != "bert":
            raise ValueError("this checkpoint records no model class, and a classifier with "
                             "task_head='transform' has the same weight names per sequence "
                             "as per token: pass model_class='BertForSequenceClassification' "
                             "or 'BertForTokenClassification'")
        if any(k.startswith("bert.pooler.") for k in weights):
            return "BertForSequenceClassification"
        return "BertForTokenClassification"
    if any(k.startswith("embeddings.") for k in weights):
        return "BertModel"
    return "BertForMaskedLM"
