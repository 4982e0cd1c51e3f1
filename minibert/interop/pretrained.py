"""`from_pretrained` and `save_pretrained`: the model classes' doors to a folder on disk.

`PretrainedMixin` sits below model.py and heads.py, which inherit from it, and above hf.py,
which knows transformers' layout (file names, parameter names, safe loading). A folder saved
here loads in transformers unchanged for a Post-LN model; a Pre-LN one is minibert-only.

A model and its tokenizer belong together: token id i means row i of the embedding. A
folder saved with its tokenizer records a fingerprint of that vocabulary in config.json
(`minibert_vocab_sha256`, the SHA-256 of its vocab.txt), so a tokenizer swapped in later is
refused on load, and `check_tokenizer_fits` refuses, before any training, a tokenizer that
does not fit a model's embeddings or special ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TypeVar

import torch

from ..atomic import replace_folder, usual_mode
from ..model.config import BertConfig
from ..paths import file_present
from .hf import (CONFIG_FILE, MODEL_FILES, MODERNBERT_MODEL_TYPE, PRE_LN_WEIGHTS_FILE, SHARD_FILE,
                 WEIGHTS_FILE, PathLike, architecture, check_tied_decoder, config_from_hf,
                 config_to_hf,
                 decodes, load_hf_state_dict, minibert_class, model_type, read_config,
                 read_weights, to_hf_state_dict)

if TYPE_CHECKING:
    from ..data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# config.json's record of the vocabulary a folder's model was saved with.
VOCAB_KEY = "minibert_vocab_sha256"
# Embedding tables are often padded to a round size for faster matmuls (BERT-base's 30,522
# rows stay, but GPT-2's 50,257 are often padded to 50,304, a multiple of 64). A model with
# up to (multiple - 1) rows more than its tokenizer's ids, rounded to one of these, fits.
ROW_MULTIPLES = (8, 16, 32, 64, 128)
# What a classifier does with a checkpoint of its own class trained for other labels.
ON_OTHER_LABELS = ("error", "new_head")


M = TypeVar("M", bound="PretrainedMixin")


class GradientCheckpointing:
    """transformers' names for the gradient-checkpointing switch of every encoder in a model
    (`model.BertModel._run_block`): each block's activations are recomputed in the backward
    pass instead of kept, the same gradients for one more forward of the blocks."""

    def gradient_checkpointing_enable(self) -> None:
        _set_checkpointing(self, True)

    def gradient_checkpointing_disable(self) -> None:
        _set_checkpointing(self, False)

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(getattr(m, "gradient_checkpointing", False) for m in self.modules())


def _set_checkpointing(model: Any, on: bool) -> None:
    for m in model.modules():
        if hasattr(m, "gradient_checkpointing"):
            m.gradient_checkpointing = on


class PretrainedMixin(GradientCheckpointing):
    """`from_pretrained` / `save_pretrained` for the public model classes."""

    config: BertConfig
    # Whether the class's logits are over the vocabulary, decoded by the word embeddings
    # (tied, as BERT's and ModernBERT's masked LMs are): its folders must keep them tied.
    decodes_vocabulary: bool = False

    @classmethod
    def _init_kwargs(cls, hf_config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments beyond the config (e.g. num_labels); may consume overrides."""
        return {}

    def _hf_config_extras(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_pretrained(cls: type[M], path: PathLike, *, on_other_labels: str = "error",
                        allow_vocab_mismatch: bool = False, dtype: Optional[torch.dtype] = None,
                        torch_dtype: Optional[torch.dtype] = None,
                        **config_overrides: Any) -> M:
        """Load a checkpoint directory in transformers' layout (or one minibert saved).

        The model comes in eval mode (dropout off), as transformers gives it; the engine
        puts it in train mode, and so does `.train()`. Overrides apply on top of the stored
        config, e.g. `attention="chunked"` or
        `hidden_dropout=0.0`. Weights missing for a head or pooler are freshly initialised
        (with a warning); weights missing from the encoder are an error. A classifier is read
        only from a checkpoint of its own class (or one that names no class).

        A classifier asked for with labels (`num_labels`, `id2label`) other than those its
        checkpoint's head was trained for would score the wrong classes under the new
        names. `on_other_labels` says what to do then: "error" (the default) refuses, naming
        both label lists; "new_head" keeps the checkpoint's encoder and starts a fresh
        classifier for the new labels (fine-tuning a trained classifier on another task).
        Leave the labels out to load the checkpoint's own head and names.

        A folder whose config.json records its vocabulary (`VOCAB_KEY`, written by
        `save_pretrained(..., tokenizer=tok)`) and whose tokenizer is another is refused,
        naming both fingerprints, unless `allow_vocab_mismatch` (deliberate vocabulary
        surgery).

        `dtype` (or `torch_dtype`, transformers' older name for it), e.g. `torch.bfloat16`:
        the parameters' dtype. The model is read in fp32 and then cast, so it computes what
        `from_pretrained(path).to(dtype)` does; without it the model is fp32 whatever the
        stored weights' dtype, as in transformers.
        """
        dtype = load_dtype(dtype, torch_dtype)
        if on_other_labels not in ON_OTHER_LABELS:
            raise ValueError(f"on_other_labels={on_other_labels!r}: choose one of "
                             f"{ON_OTHER_LABELS}")
        asked_labels = bool({"num_labels", "id2label"} & set(config_overrides))
        hf_config = read_folder_config(path, allow_vocab_mismatch)
        if decodes(cls):  # config.json's word; the weights are checked again on loading
            check_tied_decoder(hf_config)
        init_kwargs = cls._init_kwargs(hf_config, config_overrides)
        config = config_from_hf(hf_config, **config_overrides)
        model = cls(config, **init_kwargs)
        sd = read_weights(path)
        # The sequence and token classifiers share transformers' name `classifier.`, but one
        # reads the pooled [CLS] and the other every token: one's trained head is no start
        # for the other (and with another number of labels would not even fit).
        stored = hf_config.get("architectures") or []
        name = minibert_class(cls).__name__  # a user's subclass reads its base's folders
        own_head = not stored or bool({architecture(cls, False), architecture(cls, True)}
                                      & set(stored))
        own_head = own_head and any(k.startswith("classifier.") for k in sd)
        names: list[str] = []  # the checkpoint's classes, when its head would be kept
        now: list[str] = []
        if own_head and asked_labels:
            names, now = stored_labels(hf_config), list(model.id2label)
        # Classes nobody named (LABEL_i) may be named now; other names are other classes.
        renamed = names == default_labels(len(names)) and len(names) == len(now)
        if names and names != now and not renamed:
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
        load_hf_state_dict(model, sd)
        model.eval()  # as transformers gives it: dropout off until `.train()`
        return model if dtype is None else model.to(dtype)

    def save_pretrained(self, path: PathLike, tokenizer: Optional["Tokenizer"] = None) -> None:
        """Write the folder `path`: config.json and the weights, replacing an earlier export.

        Classic BERT's folder loads in transformers' Bert* classes and ModernBERT's in its
        ModernBert* classes. Any other mix of switches (Pre-LN BERT, BERT with RoPE, ...:
        `hf.model_type`) is minibert-only (weights in minibert-preln.safetensors),
        which transformers refuses instead of misreading. `tokenizer` is saved into the same
        folder in the same step. Other files already in `path` are kept, and a crash leaves
        the complete old folder or the complete new one (see `atomic.replace_folder`).
        """
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ImportError("save_pretrained writes safetensors: pip install 'minibert[hf]'"
                              ) from None
        config = config_to_hf(self.config)
        # transformers' classes of the same task: BertForMaskedLM, ModernBertForMaskedLM, ...
        modern = model_type(self.config) == MODERNBERT_MODEL_TYPE
        config.update(architectures=[architecture(type(self), modern)],
                      tie_word_embeddings=True,
                      **self._hf_config_extras())
        if tokenizer is not None:
            config[VOCAB_KEY] = vocab_sha256(tokenizer)
            if modern:  # else transformers takes ModernBERT's own ids, 50281 and 50282
                config.update(cls_token_id=tokenizer.cls_id, sep_token_id=tokenizer.sep_id,
                              bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)
        state = to_hf_state_dict(self)
        # BERT and ModernBERT folders load in transformers; any other mix of switches is
        # minibert-only, under a weights name transformers never looks for.
        weights = WEIGHTS_FILE if model_type(self.config) in ("bert", MODERNBERT_MODEL_TYPE) else \
            PRE_LN_WEIGHTS_FILE

        def write(folder: Path) -> None:
            save_file(state, str(folder / weights), metadata={"format": "pt"})
            usual_mode(folder / weights)  # safetensors makes it readable by its owner alone
            (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n",
                                              encoding="utf-8")
            if tokenizer is not None:  # its length limit for transformers' truncation
                tokenizer.save(folder, model_max_length=self.config.max_position_embeddings)

        replace_folder(Path(path), write,
                       owns=lambda name: name in MODEL_FILES or bool(SHARD_FILE.match(name)))


def load_dtype(dtype: Any, torch_dtype: Any) -> Optional[torch.dtype]:
    """The dtype a `from_pretrained` casts its model to: `dtype`, or `torch_dtype` (the name
    transformers used before `dtype`, accepted as an alias), or None (fp32), checked before
    any file is read."""
    if dtype is not None and torch_dtype is not None:
        raise TypeError("from_pretrained got both dtype= and torch_dtype=, transformers' older "
                        "name for dtype: pass dtype= alone")
    name, value = ("dtype", dtype) if torch_dtype is None else ("torch_dtype", torch_dtype)
    if value is not None and not isinstance(value, torch.dtype):
        raise TypeError(f"{name}={value!r} must be a torch.dtype, such as torch.bfloat16, "
                        f"torch.float16 or torch.float32")
    if value is not None and not value.is_floating_point:
        raise ValueError(f"{name}={value} is not a floating-point dtype; a model's parameters "
                         f"can be torch.float32, torch.bfloat16 or torch.float16")
    return value


# ---- a model and its tokenizer ------------------------------------------------------------------

def vocab_sha256(tokenizer: "Tokenizer") -> str:
    """The SHA-256 of the tokenizer's vocabulary: of its vocab.txt as `Tokenizer.save`
    writes it (one token a line, in id order), so `sha256sum vocab.txt` gives it too."""
    vocab = sorted(tokenizer.backend.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256("".join(t + "\n" for t, _ in vocab).encode("utf-8")).hexdigest()


def check_tokenizer_fits(config: BertConfig, tokenizer: "Tokenizer", *,
                         source: Optional[PathLike] = None, what: str = "the model",
                         allow_vocab_mismatch: bool = False) -> None:
    """Refuse, before any training, a tokenizer that is not the model's.

    * more ids than embedding rows: an id past the table is an index error mid-run;
    * where `source`'s config.json records its vocabulary (`VOCAB_KEY`), another one;
    * a [PAD] id other than the config's `pad_token_id` (or, where `source`'s config.json
      names them, another [UNK], [CLS], [SEP] or [MASK] id): padding or the special tokens
      would be read as words;
    * fewer ids than rows, beyond padding the table up to a round multiple (`ROW_MULTIPLES`):
      the tokenizer is another one, or the model was trained with a larger vocabulary, and
      its ids would mean other tokens.

    `source`: the model's folder, when it came from one. `what` names the model in the
    messages. `allow_vocab_mismatch` (the scripts' --allow-vocab-mismatch, for deliberate
    vocabulary surgery) waives all but the first rule, which no model survives.
    """
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


def read_folder_config(path: PathLike, allow_vocab_mismatch: bool = False) -> dict[str, Any]:
    """A model folder's config.json, read by every loader of a folder before its weights
    (the model classes' `from_pretrained`, `SentenceEncoder`, `BertMultiTask`): a folder
    whose recorded vocabulary (`VOCAB_KEY`) is not its tokenizer's is refused, unless
    `allow_vocab_mismatch` (deliberate vocabulary surgery)."""
    hf_config = read_config(path)
    if not allow_vocab_mismatch:
        _check_folder_tokenizer(Path(path), hf_config)
    return hf_config


def _check_folder_tokenizer(folder: Path, hf_config: dict[str, Any]) -> None:
    """A folder that records no vocabulary, or holds no tokenizer, passes."""
    recorded = hf_config.get(VOCAB_KEY)
    names = ("tokenizer.json", "vocab.txt")
    if not recorded or not any(file_present(folder / n) for n in names):
        return
    from ..data.tokenizer import Tokenizer  # here: the model classes need no tokenizer otherwise

    tokenizer = Tokenizer.from_pretrained(folder)
    if vocab_sha256(tokenizer) != recorded:
        raise ValueError(f"{folder}: config.json records the vocabulary its model was saved "
                         f"with (sha256 {recorded[:16]}), but the folder's tokenizer is another "
                         f"({vocab_sha256(tokenizer)[:16]}, {tokenizer.vocab_size} tokens): "
                         f"the tokenizer was replaced; put the model's own back, or pass "
                         f"allow_vocab_mismatch=True for deliberate vocabulary surgery")


def stored_labels(hf_config: dict[str, Any]) -> list[str]:
    """The class names of a checkpoint's classifier, in id order, as transformers reads them:
    its id2label, else LABEL_0, LABEL_1, ... for `num_labels` classes, else for 2 (the
    default, which transformers leaves out of config.json)."""
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
