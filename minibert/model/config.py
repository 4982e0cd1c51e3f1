"""BertConfig: the one typed, validated description of a BERT model.

Every model in minibert is built from a `BertConfig`. It is a plain dataclass, checked in
`__post_init__` so that a wrong value fails at construction with a message that names the
field, instead of as a shape error deep inside a forward pass. Checkpoints store
`dataclasses.asdict(config)`.

`BertConfig.preset(name, **overrides)` gives the compact-BERT family of Turc et al. 2019
("Well-Read Students Learn Better"), from `tiny` (2 layers, 128 hidden) to `large`, and the
modern family `modernbert-tiny` ... `modernbert-large`. (transformers' `config.json` is read
and written in `minibert/interop/hf.py`: `config_from_hf`, `config_to_hf`.)

The architecture switches, classic BERT (Devlin et al. 2019) by default and ModernBERT
(Warner et al. 2024) with all of them turned:

    norm_position          "post" LayerNorm after each residual add | "pre" before each branch
    position               "learned" absolute embeddings | "rope" rotary (rope.py)
    mlp                    "gelu" H -> I -> H | "geglu" gated, H -> 2I -> H (model.FeedForward)
    bias                   biases in every linear layer and LayerNorm | none (the decoder's kept)
    first_block_attn_norm  a Pre-LN first block normalises its input | not: the embeddings'
                           LayerNorm has just done it (ModernBERT)
    global_every           every layer attends globally (1) | every n-th, the others within
    local_window           a window of local_window tokens (local_window / 2 on each side)
    task_head              "bert": tanh pooler, bare classifiers | "transform": the MLM head's
                           dense-GELU-LayerNorm before every classifier (ModernBERT)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

NORM_POSITIONS = ("post", "pre")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "geglu")
TASK_HEADS = ("bert", "transform")
POOLINGS = ("cls", "mean")
ATTENTION_BACKENDS = ("sdpa", "math", "chunked")

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

# ModernBERT's switches, all turned (Warner et al. 2024, "Smarter, Better, Faster, Longer").
MODERN = dict(norm_position="pre", position="rope", mlp="geglu", bias=False,
              first_block_attn_norm=False, type_vocab_size=0, task_head="transform",
              layer_norm_eps=1e-5, local_window=128, global_every=3, rope_theta=160000.0,
              rope_local_theta=10000.0, max_position_embeddings=8192, hidden_dropout=0.0,
              attention_dropout=0.0)
# name: (num_layers, hidden_size, num_heads, intermediate_size). base and large are
# ModernBERT's released shapes. The small ones keep the compact sizes with the feed-forward
# width at 8/3 * hidden (rounded up to 32): GeGLU's three matrices then hold as many weights
# as BERT's two at 4 * hidden.
MODERN_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "modernbert-tiny": (2, 128, 2, 352),
    "modernbert-mini": (4, 256, 4, 704),
    "modernbert-small": (4, 512, 8, 1376),
    "modernbert-medium": (8, 512, 8, 1376),
    "modernbert-base": (22, 768, 12, 1152),
    "modernbert-large": (28, 1024, 16, 2624),
}
ALL_PRESETS = tuple(PRESETS) + tuple(MODERN_PRESETS)  # every name `BertConfig.preset` knows
# transformers' names for the fields minibert names otherwise (hf.py's config.json map).
HF_RENAMES = dict(num_hidden_layers="num_layers", num_attention_heads="num_heads",
                  hidden_dropout_prob="hidden_dropout",
                  attention_probs_dropout_prob="attention_dropout")


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
    attention_chunk_size: int = 512  # the tile; autotune.pick_chunk_size measures the best
    # The modern switches (module docstring); the defaults are classic BERT's.
    position: str = "learned"
    rope_theta: float = 10000.0  # RoPE's base in global layers
    rope_local_theta: float = 10000.0  # and in local (sliding-window) layers
    mlp: str = "gelu"
    bias: bool = True
    first_block_attn_norm: bool = True
    global_every: int = 1  # layer i attends globally when i % global_every == 0
    local_window: int = 128  # the other layers see keys within local_window // 2 of a query
    task_head: str = "bert"
    classifier_pooling: str = "cls"  # with task_head "transform": [CLS], or the mean of tokens

    def __new__(cls, *args: Any, **kwargs: Any) -> "BertConfig":
        # transformers' names are refused naming ours, before __init__ refuses them bare.
        known_fields({k: v for k, v in kwargs.items() if k in HF_RENAMES}, cls.__name__)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "attention_chunk_size", "global_every"):
            check_int("BertConfig", name, getattr(self, name), minimum=1)
        check_int("BertConfig", "type_vocab_size", self.type_vocab_size, 0)  # 0: no segments
        check_int("BertConfig", "local_window", self.local_window, minimum=2)
        check_int("BertConfig", "pad_token_id", self.pad_token_id, minimum=0)
        if self.pad_token_id >= self.vocab_size:
            raise ValueError(f"BertConfig.pad_token_id={self.pad_token_id} must be < "
                             f"vocab_size={self.vocab_size}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"BertConfig.hidden_size={self.hidden_size} must be divisible by "
                             f"num_heads={self.num_heads} (each head gets hidden_size / num_heads "
                             f"dimensions)")
        for names, fits, what in ((("hidden_dropout", "attention_dropout"), lambda x: 0 <= x < 1,
                                   "a probability in [0, 1)"),
                                  (("layer_norm_eps", "initializer_range"), lambda x: x > 0,
                                   "a positive, finite number"),
                                  (("rope_theta", "rope_local_theta"), lambda x: x > 1,
                                   "a finite number > 1 (RoPE's base)")):
            for name in names:
                x = getattr(self, name)
                # Infinity passes `x > 0` (json.loads reads it in a config.json), and an
                # infinite epsilon or RoPE base makes every output NaN.
                if (not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x)
                        or not fits(x)):
                    raise ValueError(f"BertConfig.{name}={x!r} must be {what}")
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"BertConfig.norm_position={self.norm_position!r} is not one of "
                             f"{NORM_POSITIONS}")
        for name, allowed in (("attention", ATTENTION_BACKENDS), ("position", POSITIONS),
                              ("mlp", MLPS), ("task_head", TASK_HEADS),
                              ("classifier_pooling", POOLINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"BertConfig.{name}={getattr(self, name)!r} is not one of "
                                 f"{allowed}")
        for name in ("bias", "first_block_attn_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"BertConfig.{name}={getattr(self, name)!r} must be True or "
                                 f"False")
        if self.classifier_pooling != "cls" and self.task_head != "transform":
            raise ValueError(f"BertConfig.classifier_pooling={self.classifier_pooling!r} is read "
                             f"by task_head='transform' only (BERT's tanh pooler reads [CLS]); "
                             f"set both, or leave classifier_pooling='cls'")
        if self.position == "rope" and self.head_size % 2:
            raise ValueError(f"BertConfig.position='rope' turns pairs of dimensions: the head "
                             f"size hidden_size / num_heads = {self.head_size} must be even")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def has_segments(self) -> bool:
        """Whether the model reads `token_type_ids`. Without segment embeddings
        (type_vocab_size=0, as ModernBERT) the two texts of a pair are told apart by their
        [SEP] alone, and the collators, built with `segments=config.has_segments`, leave
        the segment ids out of the batch."""
        return self.type_vocab_size > 0

    def window(self, layer: int) -> int | None:
        """How far a query of block `layer` sees: None in a global layer, else the number
        of positions on each side (local_window // 2, ModernBERT's sliding window)."""
        return None if layer % self.global_every == 0 else self.local_window // 2

    def rope_base(self, layer: int) -> float:
        """RoPE's theta in block `layer`: global and local layers may differ (ModernBERT)."""
        return self.rope_theta if self.window(layer) is None else self.rope_local_theta

    def check_fits(self, seq_len: int, vocab_size: int, what: str = "the model") -> None:
        """Refuse, before any training, inputs a model of this config cannot embed: sequences
        longer than its position table, or token ids from a larger vocabulary than its own
        (`vocab_size` is the tokenizer's). `what` names the model in the message."""
        if seq_len > self.max_position_embeddings:
            raise ValueError(f"seq_len={seq_len} exceeds {what}'s "
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
        if name not in ALL_PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {ALL_PRESETS}")
        # A modern preset names its feed-forward width; a compact one's is 4 * hidden.
        layers, hidden, heads, *width = MODERN_PRESETS.get(name) or PRESETS[name]
        fields = dict(MODERN if width else {}, num_layers=layers, hidden_size=hidden,
                      num_heads=heads, intermediate_size=width[0] if width else 4 * hidden)
        return cls(**known_fields({**fields, **overrides}, f"BertConfig.preset({name!r})"))

    def replace(self, **overrides: Any) -> "BertConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **known_fields(overrides, "BertConfig.replace"))


def check_int(owner: str, name: str, value: Any, minimum: int) -> None:
    """Refuse a field that is not an integer >= `minimum` (a bool is not one), naming it as
    `owner.name`: BertConfig's and TrainConfig's checks share it."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{owner}.{name}={value!r} must be an integer >= {minimum}")


def known_fields(fields: dict[str, Any], where: str) -> dict[str, Any]:
    """`fields` as they are, after refusing any name that is not a BertConfig field: a
    TypeError naming ours for transformers' name of one (`HF_RENAMES`), else a ValueError."""
    known = {f.name for f in dataclasses.fields(BertConfig)}
    unknown = sorted(set(fields) - known)
    if theirs := [n for n in unknown if n in HF_RENAMES]:
        raise TypeError(f"{where} got {', '.join(theirs)}, transformers' name"
                        f"{'s' * (len(theirs) > 1)} for {', '.join(HF_RENAMES[n] for n in theirs)}"
                        f": use {', '.join(f'{HF_RENAMES[n]}={fields[n]!r}' for n in theirs)}")
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; BertConfig fields are "
                         f"{sorted(known)}")
    return fields
