"""`from_pretrained` and `save_pretrained`: the model classes' doors to a folder on disk.

`PretrainedMixin` (inherited by model.py and heads.py) builds on hf.py's layout. Token id i is
row i of the embedding, so a folder saved with its tokenizer records its vocabulary
(`VOCAB_KEY`) and a tokenizer swapped in later is refused (docs/finetune.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TypeVar, Union

import torch

from ..atomic import replace_folder, usual_mode
from ..model.config import BertConfig
from ..paths import file_present
from .hf import (CONFIG_FILE, MODEL_FILES, MODERNBERT_MODEL_TYPE, PRE_LN_WEIGHTS_FILE, SHARD_FILE,
                 WEIGHTS_FILE, PathLike, architecture, check_tied_decoder, config_from_hf,
                 config_to_hf, decodes, load_hf_state_dict, minibert_class, model_type,
                 read_config, read_weights, to_hf_state_dict)
from .methods import ModelMethods

if TYPE_CHECKING:
    from ..data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# config.json's record of the vocabulary a folder's model was saved with.
VOCAB_KEY = "minibert_vocab_sha256"
# Embedding tables are often padded to a round size for faster matmuls (GPT-2's 50,257 rows
# to 50,304): a tokenizer whose ids round up to the rows at one of these fits.
ROW_MULTIPLES = (8, 16, 32, 64, 128)
# A tokenizer's files in a model folder: minibert's `Tokenizer.save` writes the first three,
# transformers the others too. A save with a tokenizer replaces them all.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json")
# What a classifier does with a checkpoint of its own class trained for other labels.
ON_OTHER_LABELS = ("error", "new_head")

M = TypeVar("M", bound="PretrainedMixin")


class PretrainedMixin(ModelMethods):
    """`from_pretrained` / `save_pretrained` for the public model classes, and transformers'
    other model methods (methods.py)."""

    config: BertConfig

    @classmethod
    def _init_kwargs(cls, hf_config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments beyond the config (e.g. num_labels); may consume overrides."""
        return {}

    def _hf_config_extras(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_pretrained(cls: type[M], path: PathLike, *, on_other_labels: str = "error",
                        allow_vocab_mismatch: bool = False,
                        dtype: Union[torch.dtype, str, None] = None,
                        torch_dtype: Union[torch.dtype, str, None] = None,
                        **config_overrides: Any) -> M:
        """Load a folder in transformers' layout (or one minibert saved), in eval mode.

        Overrides apply on top of the stored config (`attention="chunked"`). A missing head
        or pooler is freshly initialised, with a warning; a missing encoder is an error. A
        classifier's head is kept only from its own class, for its own labels: others asked
        for are refused, or with `on_other_labels="new_head"` get a fresh classifier.
        `allow_vocab_mismatch` accepts a swapped tokenizer. `dtype` (or transformers' older
        `torch_dtype`), a torch.dtype, its name or "auto" (the folder's, `stored_dtype`): read
        in fp32, then cast; else fp32.
        """
        dtype = load_dtype(dtype, torch_dtype)
        if on_other_labels not in ON_OTHER_LABELS:
            raise ValueError(f"on_other_labels={on_other_labels!r}: choose one of "
                             f"{ON_OTHER_LABELS}")
        asked_labels = bool({"num_labels", "id2label"} & set(config_overrides))
        hf_config = read_folder_config(path, allow_vocab_mismatch)
        if decodes(cls):  # config.json's word; the weights are checked again on loading
            check_tied_decoder(hf_config)
        init_kwargs = cls._init_kwargs(hf_config, config_overrides)  # may consume overrides
        model = cls(config_from_hf(hf_config, **config_overrides), **init_kwargs)
        sd = read_weights(path)
        # The sequence and token classifiers share the name `classifier.`, but one reads the
        # pooled [CLS] and the other every token: one's head is no start for the other.
        stored = hf_config.get("architectures") or []
        name = minibert_class(cls).__name__  # a user's subclass reads its base's folders
        own_head = not stored or bool({architecture(cls, False), architecture(cls, True)}
                                      & set(stored))
        own_head = own_head and any(k.startswith("classifier.") for k in sd)
        if own_head and asked_labels:  # the checkpoint's classes against those asked for
            names, now = stored_labels(hf_config), list(model.id2label)
            # Classes nobody named (LABEL_i) may be named now; other names are other classes.
            renamed = names == default_labels(len(names)) and len(names) == len(now)
            if names != now and not renamed:
                if on_other_labels == "error":
                    raise ValueError(
                        f"{path} holds a {name} trained for the labels {names}, not "
                        f"{now}: its classifier would score the wrong classes. "
                        f"Pass on_other_labels='new_head' to keep its encoder under a new "
                        f"classifier, or leave num_labels and id2label out to load its own")
                logger.info("%s classifies other labels (%s); its classifier head is replaced",
                            path, ", ".join(names[:10]))
                own_head = False
        if not own_head:
            sd = {k: t for k, t in sd.items() if not k.startswith("classifier.")}
        load_hf_state_dict(model, sd, path)
        model.eval()  # as transformers gives it: dropout off until `.train()`
        dtype = stored_dtype(dtype, hf_config, sd)
        return model if dtype is None else model.to(dtype)

    def save_pretrained(self, path: PathLike, tokenizer: Optional["Tokenizer"] = None) -> None:
        """Write the folder `path`: config.json, the weights and `tokenizer`, whole or not at
        all (`atomic.replace_folder`; other files stay). Other mixes than BERT's and
        ModernBERT's switches are minibert-only.

        A folder's model and tokenizer must belong together. With `tokenizer`, its files
        replace every tokenizer file in the folder (`TOKENIZER_FILES`), and config.json
        records its vocabulary. Without, a tokenizer already there is kept, as transformers
        keeps it (saved first, it is the user's choice for this model), unless it cannot be
        this model's: the save is refused, nothing written, where it is the tokenizer saved
        with the model being replaced (the old config.json records its vocabulary), or has
        more ids than this model's embedding rows (`check_tokenizer_kept`)."""
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ImportError("save_pretrained writes safetensors: pip install 'minibert[hf]'"
                              ) from None
        if tokenizer is None:
            check_tokenizer_kept(Path(path).expanduser(), self.config)
        config = config_to_hf(self.config)
        kind = model_type(self.config)
        modern = kind == MODERNBERT_MODEL_TYPE
        config.update(architectures=[architecture(type(self), modern)],
                      tie_word_embeddings=True, **self._hf_config_extras())
        if tokenizer is not None:
            config[VOCAB_KEY] = vocab_sha256(tokenizer)
            if modern:  # else transformers takes ModernBERT's own ids, 50281 and 50282
                config.update(cls_token_id=tokenizer.cls_id, sep_token_id=tokenizer.sep_id,
                              bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)
        state = to_hf_state_dict(self)
        weights = WEIGHTS_FILE if kind in ("bert", MODERNBERT_MODEL_TYPE) else PRE_LN_WEIGHTS_FILE

        def write(folder: Path) -> None:
            save_file(state, str(folder / weights), metadata={"format": "pt"})
            usual_mode(folder / weights)  # safetensors makes it readable by its owner alone
            (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n",
                                              encoding="utf-8")
            if tokenizer is not None:  # its length limit for transformers' truncation
                tokenizer.save(folder, model_max_length=self.config.max_position_embeddings)

        def owns(name: str) -> bool:  # the entries of the old folder this save replaces
            return (name in MODEL_FILES or bool(SHARD_FILE.match(name))
                    or tokenizer is not None and name in TOKENIZER_FILES)

        replace_folder(Path(path), write, owns=owns)


def load_dtype(dtype: Any, torch_dtype: Any) -> Union[torch.dtype, str, None]:
    """`dtype`, or its older alias `torch_dtype`, checked before any file is read: a
    floating-point torch.dtype or its name ("bfloat16"), "auto" (`stored_dtype`), or None for
    fp32 (transformers' default is "auto": minibert's stays fp32, the precision it trains in).
    """
    if dtype is not None and torch_dtype is not None:
        raise TypeError("from_pretrained got both dtype= and torch_dtype=, transformers' older "
                        "name for dtype: pass dtype= alone")
    name, value = ("dtype", dtype) if torch_dtype is None else ("torch_dtype", torch_dtype)
    if value is None or value == "auto":
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        value = getattr(torch, value)  # "bfloat16" -> torch.bfloat16, as transformers reads it
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name}={value!r} must be a torch.dtype, such as torch.bfloat16, "
                        f"torch.float16 or torch.float32, its name (\"bfloat16\") or \"auto\"")
    if not value.is_floating_point:
        raise ValueError(f"{name}={value} is not a floating-point dtype; a model's parameters "
                         f"can be torch.float32, torch.bfloat16 or torch.float16")
    return value


def stored_dtype(dtype: Union[torch.dtype, str, None], hf_config: dict[str, Any],
                 weights: dict[str, torch.Tensor]) -> Optional[torch.dtype]:
    """The dtype to cast a loaded model to: `dtype` as `load_dtype` checked it, with "auto"
    read as transformers reads it, from config.json's `dtype` (or older `torch_dtype`) entry,
    else from the first floating-point tensor of the weights."""
    if dtype != "auto":
        return dtype
    entry = hf_config.get("dtype") or hf_config.get("torch_dtype")
    if entry is not None:
        return load_dtype(entry, None)
    return next((t.dtype for t in weights.values() if t.is_floating_point()), None)


# ---- a model and its tokenizer ------------------------------------------------------------------

def vocab_sha256(tokenizer: "Tokenizer") -> str:
    """The SHA-256 of the tokenizer's vocab.txt (a token a line, in id order), as `sha256sum`."""
    vocab = sorted(tokenizer.backend.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256("".join(t + "\n" for t, _ in vocab).encode("utf-8")).hexdigest()


def check_tokenizer_fits(config: BertConfig, tokenizer: "Tokenizer", *,
                         source: Optional[PathLike] = None, what: str = "the model",
                         allow_vocab_mismatch: bool = False) -> None:
    """Refuse, before any training, a tokenizer that is not the model's (docs/finetune.md),
    or whose special ids are not those `config` or `source`'s config.json records. `what` names
    the model; `allow_vocab_mismatch` waives all but the first rule (more ids than rows)."""
    rows, ids = config.vocab_size, tokenizer.vocab_size
    if ids > rows:
        raise ValueError(f"vocabulary mismatch: the tokenizer has {ids} tokens but {what} only "
                         f"{rows} embeddings; is the tokenizer {what}'s own?")
    if allow_vocab_mismatch:
        return
    surgery = "(--allow-vocab-mismatch, for deliberate vocabulary surgery)"
    stored = read_config(source) if source is not None else {}
    recorded = stored.get(VOCAB_KEY)
    if recorded and recorded != vocab_sha256(tokenizer):
        raise ValueError(f"vocabulary mismatch: {source} records the vocabulary {what} was "
                         f"saved with (sha256 {recorded[:16]}), but the tokenizer is another "
                         f"({vocab_sha256(tokenizer)[:16]}, {ids} tokens) {surgery}")
    expected = {"[PAD]": config.pad_token_id}
    for name, key in (("[UNK]", "unk"), ("[CLS]", "cls"), ("[SEP]", "sep"), ("[MASK]", "mask")):
        if isinstance(stored.get(f"{key}_token_id"), int):
            expected[name] = stored[f"{key}_token_id"]
    have = dict(zip(("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"), tokenizer.special_ids))
    for name, want in expected.items():
        if have[name] != want:
            raise ValueError(f"special-token mismatch: the tokenizer's {name} is id "
                             f"{have[name]} but {what}'s config says {want}; is the tokenizer "
                             f"{what}'s own? {surgery}")
    if ids < rows and not any(rows == -(-ids // m) * m for m in ROW_MULTIPLES):
        raise ValueError(f"vocabulary mismatch: the tokenizer has {ids} tokens but {what} "
                         f"{rows} embedding rows, more than padding to a multiple of "
                         f"{'/'.join(map(str, ROW_MULTIPLES))} explains; is the tokenizer "
                         f"{what}'s own? {surgery}")


def check_tokenizer_kept(folder: Path, config: BertConfig) -> None:
    """Refuse to save a model without a tokenizer into `folder` where the tokenizer there
    cannot be the new model's: the one saved with the model the save replaces (the folder's
    config.json records its vocabulary, `VOCAB_KEY`, and the record goes with that file), or
    one with more ids than `config` has embedding rows. Another tokenizer, or one that cannot
    be read, is kept: it was put there for this model, or fails loudly on loading."""
    if not any(file_present(folder / n) for n in ("tokenizer.json", "vocab.txt")):
        return
    from ..data.tokenizer import Tokenizer  # here: the model classes need no tokenizer otherwise

    try:
        tokenizer = Tokenizer.from_pretrained(folder)
    except (OSError, ValueError):
        return
    try:
        recorded = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get(VOCAB_KEY)
    except (OSError, ValueError, AttributeError):  # none, or not one config.json holds
        recorded = None
    files = ", ".join(n for n in TOKENIZER_FILES if (folder / n).exists())
    fix = (f"pass the model's own tokenizer (save_pretrained({str(folder)!r}, tokenizer=...)), "
           f"which replaces them, or remove them first to save the model without one")
    if recorded == vocab_sha256(tokenizer):
        raise ValueError(f"{folder} holds the tokenizer ({files}) saved with the model this "
                         f"save replaces; kept without a word, it would load beside the new "
                         f"model as if it were its own: {fix}")
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{folder} holds a tokenizer ({files}) of {tokenizer.vocab_size} "
                         f"tokens, more than the model's {config.vocab_size} embedding rows: "
                         f"it is not this model's; {fix}")


def read_folder_config(path: PathLike, allow_vocab_mismatch: bool = False) -> dict[str, Any]:
    """A model folder's config.json, as every loader reads it: refused where its tokenizer is
    not the vocabulary it records (`VOCAB_KEY`), unless `allow_vocab_mismatch`."""
    hf_config, folder = read_config(path), Path(path)
    recorded = hf_config.get(VOCAB_KEY)
    if allow_vocab_mismatch or not recorded or not any(
            file_present(folder / n) for n in ("tokenizer.json", "vocab.txt")):
        return hf_config
    from ..data.tokenizer import Tokenizer  # here: the model classes need no tokenizer otherwise

    tokenizer = Tokenizer.from_pretrained(folder)
    if vocab_sha256(tokenizer) != recorded:
        raise ValueError(f"{folder}: config.json records the vocabulary its model was saved "
                         f"with (sha256 {recorded[:16]}), but the folder's tokenizer is another "
                         f"({vocab_sha256(tokenizer)[:16]}, {tokenizer.vocab_size} tokens): "
                         f"the tokenizer was replaced; put the model's own back, or pass "
                         f"allow_vocab_mismatch=True for deliberate vocabulary surgery")
    return hf_config


def stored_labels(hf_config: dict[str, Any]) -> list[str]:
    """A checkpoint's class names in id order: its id2label, else LABEL_i (`num_labels` or 2)."""
    stored = hf_config.get("id2label")
    if isinstance(stored, dict) and stored:
        return [str(stored[k]) for k in sorted(stored, key=int)]
    n = hf_config.get("num_labels", 2)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"config.json has num_labels={n!r}; it must be a whole number >= 1")
    return default_labels(n)


def default_labels(n: int) -> list[str]:
    """The names of n classes nobody named: LABEL_0 ... LABEL_{n-1}, as in transformers."""
    return [f"LABEL_{i}" for i in range(n)]
