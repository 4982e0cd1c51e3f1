"""BertConfig: the one typed, validated description of a BERT model.

Every model in minibert is built from a `BertConfig`. It is a plain dataclass, checked in
`__post_init__` so that a wrong value fails at construction with a message that names the
field, instead of as a shape error deep inside a forward pass. Checkpoints store
`dataclasses.asdict(config)`.

Two conversions connect it to the outside world:

* `BertConfig.preset(name, **overrides)` gives the compact-BERT family of Turc et al. 2019
  ("Well-Read Students Learn Better"), from `tiny` (2 layers, 128 hidden) to `large`, and
  the modern family `modernbert-tiny` ... `modernbert-large`.
* `BertConfig.from_hf_dict(d)` / `config.to_hf_dict()` read and write the `config.json` of a
  transformers BERT or ModernBERT checkpoint, so weights move both ways (see `minibert/hf.py`).

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
from dataclasses import dataclass
from typing import Any

NORM_POSITIONS = ("post", "pre")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "geglu")
TASK_HEADS = ("bert", "transform")
POOLINGS = ("cls", "mean")
ATTENTION_BACKENDS = ("sdpa", "math", "chunked")
# config.json's model_type for a Pre-LN model: not "bert", which transformers would misread.
PRE_LN_MODEL_TYPE = "minibert-preln"
# ... and for any other mix of switches that neither BERT nor ModernBERT has.
MINIBERT_MODEL_TYPE = "minibert"
MODERNBERT_MODEL_TYPE = "modernbert"

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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "attention_chunk_size", "global_every"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("type_vocab_size", self.type_vocab_size, minimum=0)  # 0: no segments
        _check_int("local_window", self.local_window, minimum=2)
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
        for name in ("rope_theta", "rope_local_theta"):
            x = getattr(self, name)
            if not isinstance(x, (int, float)) or isinstance(x, bool) or not x > 1:
                raise ValueError(f"BertConfig.{name}={x!r} must be a number > 1 (RoPE's base)")
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

    def model_type(self) -> str:
        """config.json's model_type: "bert" for classic BERT (Post-LN), "modernbert" when
        every modern switch is turned as ModernBERT has it, else a minibert-only type that
        transformers refuses instead of loading into other blocks."""
        modern = {k: getattr(self, k) for k in MODERN if k not in _MODERN_FREE}
        if modern == {k: v for k, v in MODERN.items() if k not in _MODERN_FREE}:
            return MODERNBERT_MODEL_TYPE
        classic = {k: getattr(self, k) for k in _SWITCH_DEFAULTS}
        if classic == _SWITCH_DEFAULTS and self.type_vocab_size >= 1:
            return PRE_LN_MODEL_TYPE if self.norm_position == "pre" else "bert"
        return MINIBERT_MODEL_TYPE

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
        if name in MODERN_PRESETS:
            layers, hidden, heads, width = MODERN_PRESETS[name]
            fields = dict(MODERN, num_layers=layers, hidden_size=hidden, num_heads=heads,
                          intermediate_size=width)
            fields.update(overrides)
            return cls(**_known_fields(fields, f"BertConfig.preset({name!r})"))
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of "
                             f"{tuple(PRESETS) + tuple(MODERN_PRESETS)}")
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
    _SWITCHES = ("position", "rope_theta", "rope_local_theta", "mlp", "bias",
                 "first_block_attn_norm", "global_every", "local_window", "task_head",
                 "classifier_pooling")

    @staticmethod
    def check_tied_decoder(d: dict[str, Any]) -> None:
        """Refuse a config.json whose MLM decoder is a matrix of its own, for a model that
        decodes (a masked LM): minibert's decoder is the word embeddings, as BERT's and
        ModernBERT's are. The encoder and the other heads never decode, and load it."""
        if d.get("tie_word_embeddings", True) is not True:
            raise ValueError("config.json has tie_word_embeddings=false: its MLM decoder is a "
                             "matrix of its own, and minibert's is the word embeddings, as "
                             "BERT's and ModernBERT's are; load it as a BertModel or a "
                             "classifier to use its encoder")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **overrides: Any) -> "BertConfig":
        """Build a config from a transformers BERT or ModernBERT `config.json` dict (or one
        minibert wrote), then apply overrides."""
        model_type = d.get("model_type", "bert")
        # Neither family's decoder: minibert's attention is bidirectional.
        for key in ("is_decoder", "add_cross_attention"):  # transformers' decoder switches
            if d.get(key):
                raise ValueError(f"config.json has {key}=true (a decoder: causal attention"
                                 f"{' over a second sequence' if key != 'is_decoder' else ''}); "
                                 f"minibert implements a bidirectional encoder only")
        if model_type == MODERNBERT_MODEL_TYPE:
            fields = _from_modernbert(d)
            fields.update({k: d[k] for k in ("attention", "attention_chunk_size") if k in d})
            fields.update(overrides)
            return cls(**_known_fields(fields, "BertConfig.from_hf_dict"))
        if model_type not in ("bert", PRE_LN_MODEL_TYPE, MINIBERT_MODEL_TYPE):
            raise ValueError(f"config.json has model_type={model_type!r}; minibert reads BERT "
                             f"and ModernBERT checkpoints (model_type 'bert', 'modernbert', "
                             f"{PRE_LN_MODEL_TYPE!r} or {MINIBERT_MODEL_TYPE!r}) only")
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
        if model_type == MINIBERT_MODEL_TYPE:  # a mix of switches only minibert computes
            fields.update({k: d[k] for k in cls._SWITCHES if k in d})
        if model_type == PRE_LN_MODEL_TYPE:
            fields["norm_position"] = "pre"
        fields.update(overrides)
        return cls(**_known_fields(fields, "BertConfig.from_hf_dict"))

    def to_hf_dict(self) -> dict[str, Any]:
        """The transformers `config.json` dict for this config (minibert-only fields included)."""
        # transformers' BERT is Post-LN only. A Pre-LN config, or any mix of switches that
        # neither BERT nor ModernBERT has, gets a model_type transformers does not know, so
        # that it refuses the checkpoint instead of computing something else.
        model_type = self.model_type()
        if model_type == MODERNBERT_MODEL_TYPE:
            return _to_modernbert(self)
        d: dict[str, Any] = {"model_type": model_type, "hidden_act": "gelu",
                             "position_embedding_type": "absolute"}
        d.update({theirs: getattr(self, ours) for theirs, ours in self._HF_NAMES.items()})
        d.update({k: getattr(self, k) for k in self._MINIBERT_ONLY})
        if model_type == MINIBERT_MODEL_TYPE:
            d.update({k: getattr(self, k) for k in self._SWITCHES})
        return d


# The switches' classic values, and the MODERN entries a ModernBERT may set as it likes.
_SWITCH_DEFAULTS = dict(position="learned", mlp="gelu", bias=True, first_block_attn_norm=True,
                        global_every=1, task_head="bert", classifier_pooling="cls")
_MODERN_FREE = frozenset({"bias", "layer_norm_eps", "local_window", "global_every", "rope_theta",
                          "rope_local_theta", "max_position_embeddings", "hidden_dropout",
                          "attention_dropout"})


def _layer_types(n_layers: int, global_every: int) -> list[str]:
    return ["full_attention" if i % global_every == 0 else "sliding_attention"
            for i in range(n_layers)]


def _from_modernbert(d: dict[str, Any]) -> dict[str, Any]:
    """BertConfig fields from a transformers ModernBERT config.json; what minibert does not
    compute (other activations, mixed biases, scaled RoPE, other layer patterns) is refused
    by name, never read as something else."""
    def refuse(field: str, value: Any, supported: str) -> ValueError:
        return ValueError(f"config.json has {field}={value!r}; minibert's ModernBERT supports "
                          f"{supported} only")

    for field in ("hidden_activation", "classifier_activation"):
        if d.get(field, "gelu") != "gelu":
            raise refuse(field, d[field], "'gelu' (exact, erf)")
    if d.get("decoder_bias", True) is not True:
        raise refuse("decoder_bias", d["decoder_bias"], "True")
    biases = {k: d.get(k, False) for k in ("attention_bias", "mlp_bias", "norm_bias",
                                          "classifier_bias")}
    if len(set(biases.values())) != 1:
        raise ValueError(f"config.json has {biases}; minibert has one switch, bias, for all "
                         f"four, so they must agree")
    layers, hidden, heads = d["num_hidden_layers"], d["hidden_size"], d["num_attention_heads"]
    if d.get("head_dim") not in (None, hidden // heads):
        raise refuse("head_dim", d["head_dim"], "hidden_size / num_attention_heads")
    # As transformers reads them: each layer kind's parameters, a legacy rope_scaling
    # applied to both, and a theta missing from either taken from the legacy keys.
    stored = d.get("rope_parameters") or {}
    rope = {kind: dict(stored.get(kind) or {}, **(d.get("rope_scaling") or {}))
            for kind in ("full_attention", "sliding_attention")}
    rope["full_attention"].setdefault("rope_theta", d.get("global_rope_theta", 160000.0))
    rope["sliding_attention"].setdefault("rope_theta", d.get("local_rope_theta", 10000.0))
    for kind, params in rope.items():
        scaling = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")}
        if params.get("rope_type", "default") != "default" or scaling:
            raise refuse(f"rope_parameters[{kind!r}] (or rope_scaling)", params,
                         "unscaled RoPE (rope_type 'default', rope_theta only)")
    window = d.get("local_attention", 128)
    if "sliding_window" in d:  # transformers' other name for half the window
        if "local_attention" in d and d["local_attention"] != 2 * d["sliding_window"]:
            raise ValueError(f"config.json has local_attention={d['local_attention']} and "
                             f"sliding_window={d['sliding_window']}, which must be half of it")
        window = 2 * d["sliding_window"]
    types = d.get("layer_types")
    every = d.get("global_attn_every_n_layers", 3)
    if types is not None:
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        every = full[1] if len(full) > 1 else layers
        if len(types) != layers or _layer_types(layers, every) != list(types):
            raise refuse("layer_types", types, "every n-th layer global from the first, the "
                         "others sliding_attention")
    return dict(
        MODERN, vocab_size=d["vocab_size"], hidden_size=hidden, num_layers=layers,
        num_heads=heads, intermediate_size=d["intermediate_size"],
        max_position_embeddings=d.get("max_position_embeddings", 8192),
        pad_token_id=d.get("pad_token_id", 0), layer_norm_eps=d.get("norm_eps", 1e-5),
        initializer_range=d.get("initializer_range", 0.02), bias=biases["attention_bias"],
        global_every=every, local_window=window,
        rope_theta=float(rope["full_attention"]["rope_theta"]),
        rope_local_theta=float(rope["sliding_attention"]["rope_theta"]),
        # minibert has one dropout rate for the residual branches, the embeddings and the
        # classifiers (placed as BERT places it), and one for the attention probabilities.
        hidden_dropout=d.get("mlp_dropout", 0.0), attention_dropout=d.get("attention_dropout",
                                                                          0.0),
        classifier_pooling=d.get("classifier_pooling", "cls"))


def _to_modernbert(c: BertConfig) -> dict[str, Any]:
    """transformers' ModernBERT config.json for a config with every modern switch turned."""
    return {
        "model_type": MODERNBERT_MODEL_TYPE, "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings, "pad_token_id": c.pad_token_id,
        "norm_eps": c.layer_norm_eps, "initializer_range": c.initializer_range,
        "hidden_activation": "gelu", "classifier_activation": "gelu",
        "attention_bias": c.bias, "mlp_bias": c.bias, "norm_bias": c.bias,
        "classifier_bias": c.bias, "decoder_bias": True, "tie_word_embeddings": True,
        "local_attention": c.local_window, "global_attn_every_n_layers": c.global_every,
        "layer_types": _layer_types(c.num_layers, c.global_every),
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": c.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": c.rope_local_theta}},
        "global_rope_theta": c.rope_theta, "local_rope_theta": c.rope_local_theta,
        "embedding_dropout": c.hidden_dropout, "mlp_dropout": c.hidden_dropout,
        "classifier_dropout": c.hidden_dropout, "attention_dropout": c.attention_dropout,
        "classifier_pooling": c.classifier_pooling,
        "attention": c.attention, "attention_chunk_size": c.attention_chunk_size}


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
