"""Checkpoints in transformers' layout: name translation and safe loading.

A transformers BERT checkpoint is a directory with `config.json` and `model.safetensors`
(or the older pickled `pytorch_model.bin`). This module reads and writes that layout, so a
minibert model loads `bert-base-uncased` or a compact BERT, and transformers loads what
minibert saves, with the same outputs.

minibert's parameter names are its own (`bert.blocks.3.attn.qkv.weight`); the translation to
transformers' names is one table, `_RENAMES`, plus one structural difference: minibert fuses
the query, key and value projections into one matrix, which transformers stores as three.

A model transformers has no class for (`model_type`: Pre-LN BERT, or a mix of
the modern switches that is neither BERT nor ModernBERT) says so in its folder (model_type
"minibert-preln" or "minibert", weights in `minibert-preln.safetensors`), so transformers
refuses it instead of loading it into other blocks, while minibert reads it as usual.

Loading never runs pickled code: safetensors holds only tensors, and `pytorch_model.bin` is
read with `torch.load(weights_only=True)`, which refuses arbitrary objects. A damaged file,
or a shard index pointing outside its folder, is one error naming the file. So is a tensor
holding NaN or infinity (`NonFiniteWeightsError`): bytes overwritten in a copy still parse
as floats, and such weights would make every output NaN and every training step be skipped.

`PretrainedMixin` (pretrained.py) gives the model classes `from_pretrained` and
`save_pretrained` on top of these functions; `export.export_checkpoint` turns a training
checkpoint into such a folder. This module imports neither the model nor its heads.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterable, Mapping

import torch
from torch import Tensor

from ..atomic import PathLike, error_gist
from ..model.config import HF_RENAMES, MODERN, BertConfig, known_fields
from ..paths import check_readable, file_present

logger = logging.getLogger(__name__)


# The two files of a training checkpoint's folder (checkpoint.py writes them): named here,
# beside the model folder's files, so that a loader given one recognises it and says so.
STATE_FILE = "state.pt"
META_FILE = "meta.json"

# minibert name -> transformers name, applied in order to names that start with "bert." (the
# encoder), "head." (MLM head), "classifier." (sequence and token classification) or
# "qa_outputs." (question answering). The task heads with no pooler (masked LM, token
# classification, QA) have no "bert.pooler." weights, as transformers' classes built with
# add_pooling_layer=False; a pooler in a checkpoint they load is simply not read.
_RENAMES = [
    (r"^bert\.embeddings\.word\.", "bert.embeddings.word_embeddings."),
    (r"^bert\.embeddings\.position\.", "bert.embeddings.position_embeddings."),
    (r"^bert\.embeddings\.token_type\.", "bert.embeddings.token_type_embeddings."),
    (r"^bert\.embeddings\.norm\.", "bert.embeddings.LayerNorm."),
    (r"^bert\.blocks\.(\d+)\.attn\.out\.", r"bert.encoder.layer.\1.attention.output.dense."),
    (r"^bert\.blocks\.(\d+)\.attn_norm\.", r"bert.encoder.layer.\1.attention.output.LayerNorm."),
    (r"^bert\.blocks\.(\d+)\.ffn\.up\.", r"bert.encoder.layer.\1.intermediate.dense."),
    (r"^bert\.blocks\.(\d+)\.ffn\.down\.", r"bert.encoder.layer.\1.output.dense."),
    (r"^bert\.blocks\.(\d+)\.ffn_norm\.", r"bert.encoder.layer.\1.output.LayerNorm."),
    # Pre-LN only; transformers has no such layer (a Pre-LN model is minibert-only).
    (r"^bert\.final_norm\.", "bert.encoder.LayerNorm."),
    (r"^bert\.pooler\.", "bert.pooler.dense."),
    (r"^head\.dense\.", "cls.predictions.transform.dense."),
    (r"^head\.norm\.", "cls.predictions.transform.LayerNorm."),
    (r"^head\.bias$", "cls.predictions.bias"),
    # The same names in both libraries, listed so that the table names every head.
    (r"^classifier\.", "classifier."),
    (r"^qa_outputs\.", "qa_outputs."),
]
_QKV = re.compile(r"^bert\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")

# The same for transformers' ModernBERT, whose encoder is "model." and which keeps Q, K and V
# fused as minibert does. Its MLM decoder is tied to the word embeddings and only its bias is
# stored; its classifiers (sequence, token, span) are all called "classifier".
_MODERN_RENAMES = [
    (r"^bert\.embeddings\.word\.", "model.embeddings.tok_embeddings."),
    (r"^bert\.embeddings\.norm\.", "model.embeddings.norm."),
    (r"^bert\.blocks\.(\d+)\.attn_norm\.", r"model.layers.\1.attn_norm."),
    (r"^bert\.blocks\.(\d+)\.attn\.qkv\.", r"model.layers.\1.attn.Wqkv."),
    (r"^bert\.blocks\.(\d+)\.attn\.out\.", r"model.layers.\1.attn.Wo."),
    (r"^bert\.blocks\.(\d+)\.ffn_norm\.", r"model.layers.\1.mlp_norm."),
    (r"^bert\.blocks\.(\d+)\.ffn\.up\.", r"model.layers.\1.mlp.Wi."),
    (r"^bert\.blocks\.(\d+)\.ffn\.down\.", r"model.layers.\1.mlp.Wo."),
    (r"^bert\.final_norm\.", "model.final_norm."),
    (r"^head\.bias$", "decoder.bias"),
    (r"^head\.dense\.", "head.dense."),
    (r"^head\.norm\.", "head.norm."),
    (r"^classifier\.", "classifier."),
    (r"^qa_outputs\.", "classifier."),
]


def is_modernbert(model: torch.nn.Module) -> bool:
    """Whether `model` is stored in transformers' ModernBERT layout (every modern switch)."""
    return model_type(model.config) == MODERNBERT_MODEL_TYPE


def hf_names(name: str, modern: bool = False) -> list[str]:
    """transformers' name(s) for one minibert parameter name (three for a fused QKV in BERT's
    layout; `modern`: ModernBERT's)."""
    m = None if modern else _QKV.match(name)
    if m:
        layer, kind = m.groups()
        return [f"bert.encoder.layer.{layer}.attention.self.{p}.{kind}"
                for p in ("query", "key", "value")]
    for pattern, repl in _MODERN_RENAMES if modern else _RENAMES:
        if re.match(pattern, name):
            return [re.sub(pattern, repl, name)]
    return [name]


def _canonical(sd: dict[str, Tensor], modern: bool = False) -> dict[str, Tensor]:
    """Bring a transformers state dict to one form: `bert.`-prefixed, weight/bias names.

    A checkpoint saved from a bare `BertModel` has no `bert.` prefix; very old ones (the
    original TF conversions) call LayerNorm parameters gamma and beta. A bare ModernBERT
    has no `model.` prefix.
    """
    if modern:
        return {("model." + k if k.startswith(("embeddings.", "layers.", "final_norm."))
                 else k): t for k, t in sd.items()}
    out = {}
    for key, t in sd.items():
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
        key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
        if key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = "bert." + key
        out[key] = t
    return out


def minibert_class(cls: type) -> type:
    """The minibert class that `cls` is or derives from, whose name is transformers' class's
    (`BertForSequenceClassification`): a user's subclass saves and loads as its base."""
    for c in cls.__mro__:
        if c.__module__.split(".")[0] == "minibert":
            return c
    return cls


def _is_bare(model: torch.nn.Module) -> bool:
    """A bare encoder (BertModel), which holds no `bert` encoder of its own: transformers'
    bare models name weights without a prefix, its heads under `bert.`."""
    return not isinstance(getattr(model, "bert", None), torch.nn.Module)


def model_prefix(model: torch.nn.Module) -> str:
    # A bare BertModel's parameters are named `embeddings...`; wrapped ones `bert.embeddings...`.
    return "bert." if _is_bare(model) else ""


def _maps(name: str, modern: bool) -> bool:
    """Whether the tables above give `name` (prefixed as `hf_names` takes it) a place in a
    model folder: a pattern matches, and only the tensor's own name (weight, bias) follows."""
    if not modern and _QKV.match(name):
        return True
    for pattern, _ in _MODERN_RENAMES if modern else _RENAMES:
        m = re.match(pattern, name)
        if m:
            return name[m.end():] in ("", "weight", "bias")
    return False


def is_adapter_name(name: str) -> bool:
    """Whether a state-dict name is one of peft's, inside a layer wrapped for LoRA."""
    return ".lora_" in name or ".base_layer." in name


def check_mappable(names: Iterable[str], modern: bool, what: str) -> None:
    """Refuse, naming them, the state-dict names that a model folder has no place for: a
    parameter or buffer added to a minibert class, or a layer wrapped by another library
    (peft's LoRA keeps `qkv.base_layer.weight` and `qkv.lora_A.default.weight`). Saved
    without them, the folder would load as another model than the one trained."""
    lost = [n for n in names if not _maps(n, modern)]
    if not lost:
        return
    if any(is_adapter_name(n) for n in lost):
        fix = ("the model carries LoRA adapters: merge them into the weights first "
               "(`model = peft_model.merge_and_unload()`), then save the merged model")
    else:
        fix = ("a model folder holds a minibert class's own tensors only; keep anything "
               "added in a file of your own (torch.save of those tensors)")
    raise ValueError(f"{what}: {len(lost)} tensor(s) have no place in a model folder and "
                     f"would be lost: {', '.join(lost[:6])}{' ...' if len(lost) > 6 else ''}; "
                     f"{fix}")


def to_hf_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The model's weights under transformers' names (BERT's fused QKV split into three).

    A tensor the tables do not map is refused (`check_mappable`), never dropped or saved
    under a name no loader reads."""
    prefix, modern = model_prefix(model), is_modernbert(model)
    check_mappable((prefix + name for name in model.state_dict()), modern,
                   f"saving a {type(model).__name__}")
    out: dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        names = hf_names(prefix + name, modern)
        for hf_name, part in zip(names, t.chunk(len(names), dim=0)):
            if _is_bare(model):  # transformers' bare models: no prefix
                hf_name = hf_name.removeprefix("model." if modern else "bert.")
            out[hf_name] = part.detach().to("cpu").contiguous().clone()
    return out


def architecture(cls: type, modern: bool) -> str:
    """transformers' class for a minibert model class, as config.json's `architectures`
    names it: the same task's, BERT's or ModernBERT's (BertForMaskedLM,
    ModernBertForMaskedLM); a user's subclass is named as its minibert base."""
    return ("Modern" if modern else "") + minibert_class(cls).__name__


def decodes(cls: type) -> bool:
    """Whether a model class decodes over the vocabulary (a masked LM), the one head whose
    checkpoint must have its decoder tied to the word embeddings (the class says so)."""
    return bool(getattr(cls, "decodes_vocabulary", False))


def _check_tied_decoder(model: torch.nn.Module, sd: dict[str, Tensor], modern: bool) -> None:
    """Refuse an MLM checkpoint whose stored decoder matrix is not its word embeddings.

    minibert's MLM head decodes with the word-embedding matrix (tied, as BERT and ModernBERT
    are), so a checkpoint may store the decoder's copy or not. A copy that differs (a model
    trained untied, its config notwithstanding) is one minibert cannot compute; transformers
    would decode with the copy, and the logits would differ from minibert's.
    """
    if not decodes(type(model)):
        return  # the other heads never decode over the vocabulary
    decoder = "decoder.weight" if modern else "cls.predictions.decoder.weight"
    words = hf_names("bert.embeddings.word.weight", modern)[0]
    if decoder in sd and words in sd and not torch.equal(sd[decoder], sd[words]):
        raise ValueError(f"the checkpoint's MLM decoder matrix ({decoder}) is not its word "
                         f"embeddings ({words}); minibert decodes with the embeddings, as BERT "
                         f"does, and cannot compute an untied model. Load it as a BertModel "
                         f"or a classifier to use its encoder")


def load_hf_state_dict(model: torch.nn.Module, sd: dict[str, Tensor]) -> None:
    """Copy a transformers-layout state dict into `model`, with clear errors and warnings."""
    modern = is_modernbert(model)
    sd = _canonical(sd, modern)
    if "cls.predictions.bias" not in sd and "cls.predictions.decoder.bias" in sd:
        sd["cls.predictions.bias"] = sd["cls.predictions.decoder.bias"]
    _check_tied_decoder(model, sd, modern)
    prefix = model_prefix(model)
    own = model.state_dict()
    new, missing = {}, []
    for name, param in own.items():
        names = hf_names(prefix + name, modern)
        if not all(n in sd for n in names):
            missing.append(name)
            continue
        t = torch.cat([sd[n] for n in names], dim=0)
        if t.shape != param.shape:
            raise ValueError(f"checkpoint tensor {' + '.join(names)} has shape {tuple(t.shape)} "
                             f"but the model expects {tuple(param.shape)} for {name}; does the "
                             f"config (or an override) match the checkpoint?")
        new[name] = t
    # Heads and the pooler may legitimately be absent (an MLM checkpoint into a classifier is
    # the usual start of fine-tuning); the encoder may not.
    fresh = ("bert.pooler.", "pooler.", "head.", "classifier.", "qa_outputs.")
    broken = [n for n in missing if not n.startswith(fresh)]
    if broken:
        raise ValueError(f"checkpoint lacks {len(broken)} encoder weight(s), e.g. "
                         f"{[hf_names(prefix + n, modern)[0] for n in broken[:3]]}; is it a BERT "
                         f"checkpoint with the same number of layers?")
    if missing:
        logger.warning("newly initialised (not in the checkpoint), train before use: %s",
                       sorted({n.rsplit(".", 1)[0] for n in missing}))
    model.load_state_dict(new, strict=False)


# ---- reading a model folder -----------------------------------------------------------------

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# A Pre-LN model's weights go under a name transformers never looks for: its BERT is Post-LN
# only, and would otherwise load them into the wrong blocks with nothing but a warning.
PRE_LN_WEIGHTS_FILE = "minibert-preln.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # sharded: {"weight_map": {name: shard file}}
TORCH_FILE = "pytorch_model.bin"
# The files of an export, which save_pretrained replaces; everything else in the folder stays.
MODEL_FILES = {CONFIG_FILE, WEIGHTS_FILE, PRE_LN_WEIGHTS_FILE, INDEX_FILE, TORCH_FILE,
                "pytorch_model.bin.index.json"}
SHARD_FILE = re.compile(r"^(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)$")
# What a path given for a model is expected to be, for the message that finds nothing there.
MODEL_FOLDER = (f"a model folder holding {CONFIG_FILE}, the weights ({WEIGHTS_FILE} or "
                f"{TORCH_FILE}) and the tokenizer")
_LFS_POINTER = b"version https://git-lfs"


class NonFiniteWeightsError(ValueError):
    """A weights file holds NaN or infinite values; the message names the tensor and file."""


def check_finite(tensors: Mapping[str, Tensor], file: PathLike,
                 fix: str = "download or export it again") -> None:
    """Refuse NaN or infinity in `tensors`, the weights read from `file`.

    Raises NonFiniteWeightsError naming the first such tensor, `file` and how many of its
    values are not finite; `fix` says what to do. Integer tensors (a position_ids buffer)
    have no NaN and pass.
    """
    for name, t in tensors.items():
        if _finite(t):
            continue
        counts = [f"{n} {what}" for n, what in ((int(torch.isnan(t).sum()), "NaN"),
                                                 (int(torch.isinf(t).sum()), "infinite"))
                  if n]
        raise NonFiniteWeightsError(
            f"{file}: tensor {name} holds {' and '.join(counts)} of its {t.numel()} values; "
            f"the weights are damaged (a bad download, copy or disk) or were saved from a "
            f"run that diverged, and would make every output NaN: {fix}")


def _finite(t: Tensor) -> bool:
    """Whether every value of `t` is finite, in one reduction for nearly every tensor."""
    if not (t.is_floating_point() or t.is_complex()):
        return True
    if t.dtype.itemsize == 1:  # float8: torch lacks some reductions for it
        t = t.float()
    # A sum is NaN or infinite whenever one of its terms is, and a reduction is several
    # times faster than the elementwise test, which builds a mask as large as the tensor.
    # Only a sum that is not finite needs that test: it tells a sum of large finite
    # weights that overflowed from a NaN.
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def require_safetensors() -> None:
    """For a script that saves a model folder when it ends: call it before training, so that
    a missing safetensors is said at the start, not after hours of work."""
    if importlib.util.find_spec("safetensors") is None:
        raise ImportError("this run saves its model with safetensors when it ends, and "
                          "safetensors is not installed: pip install 'minibert[examples]'")


def read_config(path: PathLike) -> dict[str, Any]:
    """The parsed `config.json` of a model folder, with errors that name the file."""
    path = Path(path)
    check_readable(path, expected=MODEL_FOLDER)  # a loop, a link to nothing, ... named
    if path.is_file():  # e.g. the model.safetensors of a folder: "does not exist" misleads
        raise NotADirectoryError(f"{path} is a file, not a checkpoint directory; pass the "
                                 f"folder that holds config.json and model.safetensors or "
                                 f"pytorch_model.bin (perhaps {str(path.parent)!r})")
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a folder; expected {MODEL_FOLDER}")
    cfg = path / CONFIG_FILE
    if not file_present(cfg):
        if (path / META_FILE).is_file() and (path / STATE_FILE).is_file():
            raise FileNotFoundError(f"{path} is a training checkpoint, not a model folder; "
                                    f"export it with minibert.interop.export.export_checkpoint("
                                    f"{str(path)!r}, OUT) and load OUT")
        steps = sorted(p.name for p in path.glob("step_*") if (p / META_FILE).is_file())
        if steps:
            raise FileNotFoundError(f"{path} holds training checkpoints ({', '.join(steps[-2:])}"
                                    f"), not a model folder; export one with "
                                    f"minibert.interop.export."
                                    f"export_checkpoint({str(path / steps[-1])!r}, OUT)")
        raise FileNotFoundError(f"{cfg} not found; a checkpoint directory holds config.json")
    try:
        d = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg} is not valid JSON ({e}); re-export or repair the file") from None
    if not isinstance(d, dict):
        raise ValueError(f"{cfg} must hold a JSON object, found {type(d).__name__}")
    return d


def read_weights(path: PathLike) -> dict[str, Tensor]:
    """The tensors of a model folder: safetensors preferred, pickles only as weights.

    A missing file is a FileNotFoundError and a damaged one a ValueError, each naming the
    file; a tensor holding NaN or infinity is a NonFiniteWeightsError (a ValueError) naming
    the tensor and its file. That check is one sum per tensor, as each is read: a small
    cost beside reading it.
    """
    files = _weight_files(Path(path))
    if files[0].suffix != ".safetensors":
        return _load_torch_file(files[0])
    sd: dict[str, Tensor] = {}
    for file in files:
        sd.update(_load_safetensors(file))
    return sd


def check_weights(path: PathLike) -> None:
    """Raise what `read_weights` would for missing or damaged weight files, reading only
    their headers: a cheap check for a script that reads the weights later and would first
    spend minutes on other work (tokenizing a corpus).

    safetensors' header gives every tensor's byte range, checked against the file's size,
    so a file cut short is found before any tensor is read. A pickled `pytorch_model.bin`
    has no such header and is read whole. Whether the values are finite is checked where
    they are read (`read_weights`), once.
    """
    files = _weight_files(Path(path))
    if files[0].suffix != ".safetensors":
        _load_torch_file(files[0])
        return
    for file in files:
        _load_safetensors(file, header_only=True)


def _weight_files(path: Path) -> list[Path]:
    """The files holding a model folder's weights, in the order `read_weights` prefers:
    one safetensors file, a safetensors index's shards, or a pickled `pytorch_model.bin`."""
    for name in (WEIGHTS_FILE, PRE_LN_WEIGHTS_FILE):
        if file_present(path / name):  # a link to nothing is named, not passed over
            return [path / name]
    if file_present(path / INDEX_FILE):
        return _shard_files(path / INDEX_FILE)
    if file_present(path / TORCH_FILE):
        return [path / TORCH_FILE]
    raise FileNotFoundError(f"no weights in {path}: looked for {WEIGHTS_FILE}, "
                            f"{PRE_LN_WEIGHTS_FILE}, {INDEX_FILE} and {TORCH_FILE}")


def _shard_files(index: Path) -> list[Path]:
    """The shard files a safetensors index names, each checked to lie inside its folder."""
    try:
        d = json.loads(index.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{index} is not valid JSON ({e}); download or export the "
                         f"checkpoint again") from None
    weight_map = d.get("weight_map") if isinstance(d, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise ValueError(f"{index} has no weight_map of tensor name -> shard file name; it is "
                         f"damaged or not a safetensors index")
    shards = []
    for name in sorted(set(weight_map.values())):
        # Names come from the file: "../x" or "/x" would read outside the folder. Judged by
        # the name, not by resolving links, since a hub cache links shards to blobs elsewhere.
        posix, windows = PurePosixPath(name), PureWindowsPath(name)
        if not name or posix.is_absolute() or windows.anchor or ".." in posix.parts + windows.parts:
            raise ValueError(f"{index} names the shard {name!r}, which lies outside "
                             f"{index.parent}; refusing to read it (the index is damaged or "
                             f"was made to read other files)")
        if not file_present(index.parent / name):
            raise FileNotFoundError(f"shard {name} listed in {index} is not in {index.parent}; "
                                    f"the download is incomplete, fetch the missing shard")
        shards.append(index.parent / name)
    return shards


def _load_safetensors(file: Path, header_only: bool = False) -> dict[str, Tensor]:
    """The tensors in `file`, each checked to be finite as it is read (`check_finite`);
    with `header_only`, none: the header is read and checked against the file's size (every
    tensor's byte range must lie inside it)."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ImportError(f"reading {file} needs the safetensors package: "
                          f"pip install 'minibert[hf]'") from None
    sd: dict[str, Tensor] = {}
    try:
        with safe_open(str(file), framework="pt") as f:
            if header_only:
                return {}
            for name in f.keys():  # what safetensors' load_file does, with the check
                t = f.get_tensor(name)
                check_finite({name: t}, file)
                sd[name] = t
    except SafetensorError as e:
        raise _damaged(file, "safetensors file", e) from None
    return sd


def _load_torch_file(file: Path) -> dict[str, Tensor]:
    """The state dict in a pickled `pytorch_model.bin`, read without running code from it."""
    with open(file, "rb") as f:  # failing to open is an OSError about the file, not damage
        try:
            sd = torch.load(f, map_location="cpu", weights_only=True)
        except MemoryError:
            raise
        except Exception as e:
            # weights_only=True rebuilds tensors and plain values only. "Unsupported global"
            # is a well-formed pickle asking for some other object (a class instance, a
            # function): code, refused. Anything else (bad opcodes, a truncated zip) is damage.
            if "Unsupported global" in str(e):
                raise ValueError(f"{file} holds pickled objects other than tensors; refusing "
                                 f"to unpickle them, since that could run arbitrary code. "
                                 f"Re-save the weights as a plain state dict or as "
                                 f"safetensors. ({error_gist(e)})") from None
            raise _damaged(file, "PyTorch checkpoint", e) from None
    if not isinstance(sd, dict) or not all(isinstance(t, Tensor) for t in sd.values()):
        raise ValueError(f"{file} does not hold a state dict (name -> tensor)")
    check_finite(sd, file)
    return sd


def _damaged(file: Path, kind: str, error: Exception) -> ValueError:
    """The one-line error for a weights file that cannot be read."""
    with open(file, "rb") as f:
        if f.read(len(_LFS_POINTER)) == _LFS_POINTER:
            return ValueError(f"{file} is a Git LFS pointer, not the weights: run `git lfs "
                              f"pull` in the clone it came from, or download the file itself")
    return ValueError(f"{file} is damaged or not a {kind} ({error_gist(error)}); download or "
                      f"export it again")


# ---- config.json: BertConfig <-> transformers' BERT and ModernBERT configs --------------------
# `config_from_hf` reads a transformers config.json (or one minibert wrote) into a BertConfig,
# `config_to_hf` writes one, so weights move both ways. What minibert does not compute (other
# activations, scaled RoPE, a decoder, ...) is refused by name, never read as something else.

# config.json's model_type for a Pre-LN model: not "bert", which transformers would misread.
PRE_LN_MODEL_TYPE = "minibert-preln"
# ... and for any other mix of switches that neither BERT nor ModernBERT has.
MINIBERT_MODEL_TYPE = "minibert"
MODERNBERT_MODEL_TYPE = "modernbert"


def model_type(config: BertConfig) -> str:
    """config.json's model_type: "bert" for classic BERT (Post-LN), "modernbert" when
    every modern switch is turned as ModernBERT has it, else a minibert-only type that
    transformers refuses instead of loading into other blocks."""
    modern = {k: getattr(config, k) for k in MODERN if k not in _MODERN_FREE}
    if modern == {k: v for k, v in MODERN.items() if k not in _MODERN_FREE}:
        return MODERNBERT_MODEL_TYPE
    classic = {k: getattr(config, k) for k in _SWITCH_DEFAULTS}
    if classic == _SWITCH_DEFAULTS and config.type_vocab_size >= 1:
        return PRE_LN_MODEL_TYPE if config.norm_position == "pre" else "bert"
    return MINIBERT_MODEL_TYPE


# transformers' name -> minibert's name, for the fields both have: under the same name, or
# under another (config.HF_RENAMES, which BertConfig also reads to refuse them).
_HF_NAMES = {**{name: name for name in ("vocab_size", "hidden_size", "intermediate_size",
                                        "max_position_embeddings", "type_vocab_size",
                                        "layer_norm_eps", "initializer_range", "pad_token_id")},
             **HF_RENAMES}
# minibert-only fields, written into config.json under their own names.
_MINIBERT_ONLY = ("norm_position", "attention", "attention_chunk_size")
_SWITCHES = ("position", "rope_theta", "rope_local_theta", "mlp", "bias",
             "first_block_attn_norm", "global_every", "local_window", "task_head",
             "classifier_pooling")


def check_tied_decoder(d: dict[str, Any]) -> None:
    """Refuse a config.json whose MLM decoder is a matrix of its own, for a model that
    decodes (a masked LM): minibert's decoder is the word embeddings, as BERT's and
    ModernBERT's are. The encoder and the other heads never decode, and load it."""
    if d.get("tie_word_embeddings", True) is not True:
        raise ValueError("config.json has tie_word_embeddings=false: its MLM decoder is a "
                         "matrix of its own, and minibert's is the word embeddings, as "
                         "BERT's and ModernBERT's are; load it as a BertModel or a "
                         "classifier to use its encoder")


def config_from_hf(d: dict[str, Any], **overrides: Any) -> BertConfig:
    """Build a config from a transformers BERT or ModernBERT `config.json` dict (or one
    minibert wrote), then apply overrides."""
    kind = d.get("model_type", "bert")
    # Neither family's decoder: minibert's attention is bidirectional.
    for key in ("is_decoder", "add_cross_attention"):  # transformers' decoder switches
        if d.get(key):
            raise ValueError(f"config.json has {key}=true (a decoder: causal attention"
                             f"{' over a second sequence' if key != 'is_decoder' else ''}); "
                             f"minibert implements a bidirectional encoder only")
    if kind == MODERNBERT_MODEL_TYPE:
        fields = _from_modernbert(d)
        fields.update({k: d[k] for k in ("attention", "attention_chunk_size") if k in d})
        fields.update(overrides)
        return BertConfig(**known_fields(fields, "config_from_hf"))
    if kind not in ("bert", PRE_LN_MODEL_TYPE, MINIBERT_MODEL_TYPE):
        raise ValueError(f"config.json has model_type={kind!r}; minibert reads BERT "
                         f"and ModernBERT checkpoints (model_type 'bert', 'modernbert', "
                         f"{PRE_LN_MODEL_TYPE!r} or {MINIBERT_MODEL_TYPE!r}) only")
    if kind == PRE_LN_MODEL_TYPE and d.get("norm_position", "pre") != "pre":
        raise ValueError(f"config.json has model_type={kind!r} but norm_position="
                         f"{d['norm_position']!r}; a {kind!r} model is Pre-LN, so "
                         f"norm_position must be 'pre' (or absent)")
    act = d.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"config.json has hidden_act={act!r}; minibert implements BERT's "
                         f"exact (erf) GELU only, hidden_act='gelu'")
    pos = d.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"config.json has position_embedding_type={pos!r}; minibert "
                         f"implements learned absolute positions only")
    fields = {ours: d[theirs] for theirs, ours in _HF_NAMES.items()
              if d.get(theirs) is not None}
    fields.update({k: d[k] for k in _MINIBERT_ONLY if k in d})
    if kind == MINIBERT_MODEL_TYPE:  # a mix of switches only minibert computes
        fields.update({k: d[k] for k in _SWITCHES if k in d})
    if kind == PRE_LN_MODEL_TYPE:
        fields["norm_position"] = "pre"
    fields.update(overrides)
    return BertConfig(**known_fields(fields, "config_from_hf"))


def config_to_hf(config: BertConfig) -> dict[str, Any]:
    """The transformers `config.json` dict for this config (minibert-only fields included)."""
    # transformers' BERT is Post-LN only. A Pre-LN config, or any mix of switches that
    # neither BERT nor ModernBERT has, gets a model_type transformers does not know, so
    # that it refuses the checkpoint instead of computing something else.
    kind = model_type(config)
    if kind == MODERNBERT_MODEL_TYPE:
        return _to_modernbert(config)
    d: dict[str, Any] = {"model_type": kind, "hidden_act": "gelu",
                         "position_embedding_type": "absolute"}
    d.update({theirs: getattr(config, ours) for theirs, ours in _HF_NAMES.items()})
    d.update({k: getattr(config, k) for k in _MINIBERT_ONLY})
    if kind == MINIBERT_MODEL_TYPE:
        d.update({k: getattr(config, k) for k in _SWITCHES})
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
