"""`from_pretrained` and `save_pretrained`: the model classes' doors to a folder on disk.

`PretrainedMixin` sits below model.py and heads.py, which inherit from it, and above hf.py,
which knows transformers' layout (file names, parameter names, safe loading). A folder saved
here loads in transformers unchanged for a Post-LN model; a Pre-LN one is minibert-only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .atomic import replace_folder
from .config import BertConfig
from .hf import (CONFIG_FILE, MODEL_FILES, PRE_LN_WEIGHTS_FILE, SHARD_FILE, WEIGHTS_FILE, PathLike,
                 load_hf_state_dict, read_config, read_weights, to_hf_state_dict)

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


class PretrainedMixin:
    """`from_pretrained` / `save_pretrained` for the public model classes."""

    config: BertConfig

    @classmethod
    def _init_kwargs(cls, hf_config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments beyond the config (e.g. num_labels); may consume overrides."""
        return {}

    def _hf_config_extras(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_pretrained(cls, path: PathLike, **config_overrides: Any):
        """Load a checkpoint directory in transformers' layout (or one minibert saved).

        Overrides apply on top of the stored config, e.g. `attention="chunked"` or
        `hidden_dropout=0.0`. Weights missing for a head or pooler are freshly initialised
        (with a warning); weights missing from the encoder are an error. A classifier is read
        only from a checkpoint of its own class (or one that names no class).
        """
        hf_config = read_config(path)
        init_kwargs = cls._init_kwargs(hf_config, config_overrides)
        config = BertConfig.from_hf_dict(hf_config, **config_overrides)
        model = cls(config, **init_kwargs)
        sd = read_weights(path)
        # The sequence and token classifiers share transformers' name `classifier.`, but one
        # reads the pooled [CLS] and the other every token: one's trained head is no start
        # for the other (and with another number of labels would not even fit).
        stored = hf_config.get("architectures") or []
        if stored and cls.__name__ not in stored:
            sd = {k: t for k, t in sd.items() if not k.startswith("classifier.")}
        load_hf_state_dict(model, sd)
        return model

    def save_pretrained(self, path: PathLike, tokenizer: Optional["Tokenizer"] = None) -> None:
        """Write the folder `path`: config.json and the weights, replacing an earlier export.

        A Post-LN model's folder loads in transformers unchanged. A Pre-LN model's is
        minibert-only (model_type "minibert-preln", weights in minibert-preln.safetensors),
        which transformers refuses instead of misreading. `tokenizer` is saved into the same
        folder in the same step. Other files already in `path` are kept, and a crash leaves
        the complete old folder or the complete new one (see `atomic.replace_folder`).
        """
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ImportError("save_pretrained writes safetensors: pip install 'minibert[hf]'"
                              ) from None
        config = self.config.to_hf_dict()
        config.update(architectures=[type(self).__name__], tie_word_embeddings=True,
                      **self._hf_config_extras())
        state = to_hf_state_dict(self)
        weights = PRE_LN_WEIGHTS_FILE if self.config.norm_position == "pre" else WEIGHTS_FILE

        def write(folder: Path) -> None:
            save_file(state, str(folder / weights), metadata={"format": "pt"})
            (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n",
                                              encoding="utf-8")
            if tokenizer is not None:
                tokenizer.save(folder)

        replace_folder(Path(path), write,
                       owns=lambda name: name in MODEL_FILES or bool(SHARD_FILE.match(name)))
