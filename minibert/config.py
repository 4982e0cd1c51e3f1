"""BertConfig: the one typed, validated description of a BERT model.

Every model in minibert is built from a `BertConfig`. It is a plain dataclass, checked in
`__post_init__` so that a wrong value fails at construction with a message that names the
field, instead of as a shape error deep inside a forward pass. Checkpoints store
`dataclasses.asdict(config)`.

Two conversions connect it to the outside world:

* `BertConfig.preset(name, **overrides)` gives the compact-BERT family of Turc et al. 2019
  ("Well-Read Students Learn Better"), from `tiny` (2 layers, 128 hidden) to `large`.
* `BertConfig.from_hf_dict(d)` / `config.to_hf_dict()` read and write the `config.json` of a
  transformers BERT checkpoint, so weights move both ways (see `minibert/hf.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

NORM_POSITIONS = ("post", "pre")
ATTENTION_BACKENDS = ("sdpa", "math", "chunked")
# config.json's model_type for a Pre-LN model: not "bert", which transformers would misread.
PRE_LN_MODEL_TYPE = "minibert-preln"

# name: (num_layers, hidden_size, num_heads). The feed-forward width is always 4 * hidden,
# as in the original BERT and the compact models released with it.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder. The defaults are BERT-base (Devlin et al. 2019)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # "post": LayerNorm after each residual add (original BERT, transformers-compatible).
    # "pre": LayerNorm at the start of each branch, plus one final LayerNorm (Xiong et al. 2020).
    norm_position: str = "post"
    # "sdpa": torch's fused kernel (default; fp32 CPU training with dropout takes the formula).
    # "math": the explicit formula, for reading.
    # "chunked": exact attention in O(T * chunk) training memory (see attention.py).
    attention: str = "sdpa"
    attention_chunk_size: int = 128  # the tile; attention.pick_chunk_size measures the best

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "attention_chunk_size"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("pad_token_id", self.pad_token_id, minimum=0)
        if self.pad_token_id >= self.vocab_size:
            raise ValueError(f"BertConfig.pad_token_id={self.pad_token_id} must be < "
                             f"vocab_size={self.vocab_size}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"BertConfig.hidden_size={self.hidden_size} must be divisible by "
                             f"num_heads={self.num_heads} (each head gets hidden_size / num_heads "
                             f"dimensions)")
        for name in ("hidden_dropout", "attention_dropout"):
            p = getattr(self, name)
            if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
                raise ValueError(f"BertConfig.{name}={p!r} must be a probability in [0, 1)")
        for name in ("layer_norm_eps", "initializer_range"):
            x = getattr(self, name)
            if not isinstance(x, (int, float)) or isinstance(x, bool) or not x > 0:
                raise ValueError(f"BertConfig.{name}={x!r} must be a positive number")
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"BertConfig.norm_position={self.norm_position!r} is not one of "
                             f"{NORM_POSITIONS}")
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"BertConfig.attention={self.attention!r} is not one of "
                             f"{ATTENTION_BACKENDS}")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    def check_fits(self, seq_len: int, vocab_size: int, what: str = "the model") -> None:
        """Refuse, before any training, inputs a model of this config cannot embed: sequences
        longer than its position table, or token ids from a larger vocabulary than its own
        (`vocab_size` is the tokenizer's). `what` names the model in the message."""
        if seq_len > self.max_position_embeddings:
            raise ValueError(f"sequence length {seq_len} exceeds {what}'s "
                             f"max_position_embeddings={self.max_position_embeddings}; use "
                             f"sequences of at most {self.max_position_embeddings} tokens")
        if vocab_size > self.vocab_size:
            raise ValueError(f"vocabulary mismatch: the tokenizer has {vocab_size} tokens but "
                             f"{what} only {self.vocab_size} embeddings; is the tokenizer "
                             f"{what}'s own?")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A compact-BERT size by name (tiny, mini, small, medium, base, large), with overrides.

        >>> BertConfig.preset("mini", vocab_size=8000).hidden_size
        256
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {tuple(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads,
                      intermediate_size=4 * hidden)
        fields.update(overrides)
        return cls(**_known_fields(fields, f"BertConfig.preset({name!r})"))

    def replace(self, **overrides: Any) -> "BertConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **_known_fields(overrides, "BertConfig.replace"))

    # ---- transformers' config.json -------------------------------------------------------------
    # transformers' name -> minibert's name, for the fields both have.
    _HF_NAMES = {
        "vocab_size": "vocab_size",
        "hidden_size": "hidden_size",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_heads",
        "intermediate_size": "intermediate_size",
        "max_position_embeddings": "max_position_embeddings",
        "type_vocab_size": "type_vocab_size",
        "hidden_dropout_prob": "hidden_dropout",
        "attention_probs_dropout_prob": "attention_dropout",
        "layer_norm_eps": "layer_norm_eps",
        "initializer_range": "initializer_range",
        "pad_token_id": "pad_token_id",
    }
    # minibert-only fields, written into config.json under their own names.
    _MINIBERT_ONLY = ("norm_position", "attention", "attention_chunk_size")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **overrides: Any) -> "BertConfig":
        """Build a config from a transformers BERT `config.json` dict, then apply overrides."""
        model_type = d.get("model_type", "bert")
        if model_type not in ("bert", PRE_LN_MODEL_TYPE):
            raise ValueError(f"config.json has model_type={model_type!r}; minibert reads BERT "
                             f"checkpoints (model_type 'bert' or {PRE_LN_MODEL_TYPE!r}) only")
        if model_type == PRE_LN_MODEL_TYPE and d.get("norm_position", "pre") != "pre":
            raise ValueError(f"config.json has model_type={model_type!r} but norm_position="
                             f"{d['norm_position']!r}; a {model_type!r} model is Pre-LN, so "
                             f"norm_position must be 'pre' (or absent)")
        act = d.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"config.json has hidden_act={act!r}; minibert implements BERT's "
                             f"exact (erf) GELU only, hidden_act='gelu'")
        pos = d.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError(f"config.json has position_embedding_type={pos!r}; minibert "
                             f"implements learned absolute positions only")
        fields = {ours: d[theirs] for theirs, ours in cls._HF_NAMES.items()
                  if d.get(theirs) is not None}
        fields.update({k: d[k] for k in cls._MINIBERT_ONLY if k in d})
        if model_type == PRE_LN_MODEL_TYPE:
            fields["norm_position"] = "pre"
        fields.update(overrides)
        return cls(**_known_fields(fields, "BertConfig.from_hf_dict"))

    def to_hf_dict(self) -> dict[str, Any]:
        """The transformers `config.json` dict for this config (minibert-only fields included)."""
        # transformers' BERT is Post-LN only. A Pre-LN config gets a model_type transformers
        # does not know, so that it refuses the checkpoint instead of computing something else.
        model_type = PRE_LN_MODEL_TYPE if self.norm_position == "pre" else "bert"
        d: dict[str, Any] = {"model_type": model_type, "hidden_act": "gelu",
                             "position_embedding_type": "absolute"}
        d.update({theirs: getattr(self, ours) for theirs, ours in self._HF_NAMES.items()})
        d.update({k: getattr(self, k) for k in self._MINIBERT_ONLY})
        return d


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"BertConfig.{name}={value!r} must be an integer >= {minimum}")


def _known_fields(fields: dict[str, Any], where: str) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(BertConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; BertConfig fields are "
                         f"{sorted(known)}")
    return fields
