"""Checkpoints in transformers' layout: name translation and safe loading.

Which folders load with the same outputs, which transformers loads, and how loading stays
safe: README, "The model in a few lines". Names translate through `_RENAMES`; a damaged file,
a shard outside its folder, NaN or infinity (`NonFiniteWeightsError`), or a tensor that the
model config.json describes has no place for (`_UNREAD`: what may stay unread) is one error
naming the file. Imports neither model nor heads.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterable, Mapping, Optional

import torch
from torch import Tensor

from ..atomic import PathLike, error_gist
from ..model.config import HF_RENAMES, MODERN, BertConfig, known_fields
from ..paths import check_readable, file_present

logger = logging.getLogger(__name__)

# A training checkpoint's two files (checkpoint.py writes them), which a loader recognises.
STATE_FILE = "state.pt"
META_FILE = "meta.json"

# minibert name -> transformers name(s), the first match applied. The heads without a pooler
# have no "bert.pooler." weights (transformers' add_pooling_layer=False); a stored one is unread.
_RENAMES = [
    (r"^bert\.embeddings\.word\.", "bert.embeddings.word_embeddings."),
    (r"^bert\.embeddings\.position\.", "bert.embeddings.position_embeddings."),
    (r"^bert\.embeddings\.token_type\.", "bert.embeddings.token_type_embeddings."),
    (r"^bert\.embeddings\.norm\.", "bert.embeddings.LayerNorm."),
    # minibert's fused QKV is transformers' query, key and value: three rows of it, in order.
    (r"^bert\.blocks\.(\d+)\.attn\.qkv\.", [rf"bert.encoder.layer.\1.attention.self.{p}."
                                            for p in ("query", "key", "value")]),
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

# The same for ModernBERT, whose encoder is "model.", with Q, K and V fused as in minibert,
# only its tied decoder's bias stored, and every classifier called "classifier".
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
    """transformers' name(s) for a minibert name (three for BERT's QKV; `modern`: ModernBERT's)."""
    for pattern, repl in _MODERN_RENAMES if modern else _RENAMES:
        if re.match(pattern, name):
            return [re.sub(pattern, r, name) for r in ([repl] if isinstance(repl, str) else repl)]
    return [name]


def _canonical(sd: dict[str, Tensor], modern: bool = False) -> dict[str, Tensor]:
    """A state dict with a bare model's missing prefix added, and TF's gamma/beta renamed."""
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
    """The minibert class `cls` is or derives from: a user's subclass saves as its base."""
    return next((c for c in cls.__mro__ if c.__module__.split(".")[0] == "minibert"), cls)


def model_prefix(model: torch.nn.Module) -> str:
    """Prefix "bert." for a bare encoder (BertModel), whose names lack the heads' `bert.`."""
    return "" if isinstance(getattr(model, "bert", None), torch.nn.Module) else "bert."


def _maps(name: str, modern: bool) -> bool:
    """Whether a table gives `name` a place: a pattern matches, then only weight or bias."""
    table = _MODERN_RENAMES if modern else _RENAMES
    m = next(filter(None, (re.match(pattern, name) for pattern, _ in table)), None)
    return m is not None and name[m.end():] in ("", "weight", "bias")


def is_adapter_name(name: str) -> bool:
    """Whether a state-dict name is one of peft's, inside a layer wrapped for LoRA."""
    return ".lora_" in name or ".base_layer." in name


def check_mappable(names: Iterable[str], modern: bool, what: str) -> None:
    """Refuse, naming them, the names a model folder has no place for (a tensor added to a
    class, peft's `qkv.lora_A...`), which saved without would load as another model."""
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
    """The model's weights under transformers' names; one not mapped is refused, never lost."""
    prefix, modern = model_prefix(model), is_modernbert(model)
    check_mappable((prefix + name for name in model.state_dict()), modern,
                   f"saving a {type(model).__name__}")
    out: dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        names = hf_names(prefix + name, modern)
        for hf_name, part in zip(names, t.chunk(len(names), dim=0)):
            if prefix:  # transformers' bare models: no prefix
                hf_name = hf_name.removeprefix("model." if modern else "bert.")
            out[hf_name] = part.detach().to("cpu").contiguous().clone()
    return out


def architecture(cls: type, modern: bool) -> str:
    """config.json's `architectures` name: its minibert base's, ModernBERT's for `modern`."""
    return ("Modern" if modern else "") + minibert_class(cls).__name__


def decodes(cls: type) -> bool:
    """Whether a model class decodes over the vocabulary with the tied word embeddings."""
    return bool(getattr(cls, "decodes_vocabulary", False))


# Tensors a folder may hold that a model leaves unread on purpose: the heads of other classes
# (transformers' MLM and next-sentence heads under `cls.`, a classifier, a span head,
# ModernBERT's `head.` and `decoder.`), the pooler of a class without one (transformers'
# add_pooling_layer=False), and transformers' integer position_ids / token_type_ids buffers.
# Any other tensor not taken is part of an encoder that config.json does not describe.
_UNREAD = re.compile(r"^(cls|classifier|qa_outputs|head|decoder)\.|^bert\.pooler\."
                     r"|^bert\.embeddings\.(position_ids|token_type_ids)$")


def load_hf_state_dict(model: torch.nn.Module, sd: dict[str, Tensor],
                       source: Optional[PathLike] = None) -> None:
    """Copy a transformers-layout state dict into `model`, with clear errors and warnings.

    Each tensor of the model's encoder must be in `sd`, and each tensor of `sd` taken by the
    model or one of `_UNREAD` (a head or pooler the class does not have): a config that
    disagrees with its weights is refused, naming the tensors and `source`, the folder."""
    new, missing = match_hf_state_dict(model, sd, source)
    if missing:
        logger.warning("newly initialised (not in the checkpoint), train before use: %s",
                       sorted({n.rsplit(".", 1)[0] for n in missing}))
    model.load_state_dict(new, strict=False)


def match_hf_state_dict(model: torch.nn.Module, sd: dict[str, Tensor],
                        source: Optional[PathLike] = None
                        ) -> tuple[dict[str, Tensor], list[str]]:
    """`load_hf_state_dict`'s checks: the model's state dict found in `sd` (QKV joined), and
    the names of the head and pooler tensors `sd` lacks, to be newly initialised. Tensors on
    the meta device (`read_weights(header_only=True)`) are checked by name and shape."""
    modern = is_modernbert(model)
    where = "the checkpoint" if source is None else str(weights_path(Path(source)))
    sd = _canonical(sd, modern)
    if "cls.predictions.bias" not in sd and "cls.predictions.decoder.bias" in sd:
        sd["cls.predictions.bias"] = sd["cls.predictions.decoder.bias"]
    # A masked LM decodes with its word embeddings; a stored decoder copy that differs (trained
    # untied) is what transformers would decode with, and minibert cannot compute it.
    decoder = "decoder.weight" if modern else "cls.predictions.decoder.weight"
    words = hf_names("bert.embeddings.word.weight", modern)[0]
    if (decodes(type(model)) and decoder in sd and words in sd and not sd[words].is_meta
            and not torch.equal(sd[decoder], sd[words])):
        raise ValueError(f"the checkpoint's MLM decoder matrix ({decoder}) is not its word "
                         f"embeddings ({words}); minibert decodes with the embeddings, as BERT "
                         f"does, and cannot compute an untied model. Load it as a BertModel "
                         f"or a classifier to use its encoder")
    prefix = model_prefix(model)
    # What to do when config.json and the weights disagree, said by each error below.
    fix = ("config.json must describe the model the weights hold: put back the config.json "
           "saved with them, or repair the field that differs (or the override passed)")
    new, missing, taken = {}, [], set()
    for name, param in model.state_dict().items():
        names = hf_names(prefix + name, modern)
        taken.update(names)
        if not all(n in sd for n in names):
            missing.append(name)
            continue
        t = torch.cat([sd[n] for n in names], dim=0)
        if t.shape != param.shape:
            raise ValueError(f"{where}: tensor {' + '.join(names)} has shape {tuple(t.shape)} "
                             f"but the model built from config.json expects "
                             f"{tuple(param.shape)} for {name}; {fix}")
        new[name] = t
    # Heads and the pooler may be absent (an MLM checkpoint into a classifier); the encoder not.
    fresh = ("bert.pooler.", "pooler.", "head.", "classifier.", "qa_outputs.")
    broken = [hf_names(prefix + n, modern)[0] for n in missing if not n.startswith(fresh)]
    if broken:
        raise ValueError(f"{where} lacks {len(broken)} encoder weight(s) that the "
                         f"{type(model).__name__} built from config.json needs: "
                         f"{listed(broken)}; {fix}")
    # Left over: more layers than config.json says, a learned position table under
    # position='rope', a Pre-LN final norm under a Post-LN config. Loading without them would
    # compute another model than the one saved, without a word.
    unread = sorted(n for n in sd if n not in taken and not _UNREAD.match(n))
    if unread:
        raise ValueError(f"{where} holds {len(unread)} tensor(s) that the "
                         f"{type(model).__name__} built from config.json has no place for: "
                         f"{listed(unread)}; {fix}")
    return new, missing


def listed(names: list[str], shown: int = 4) -> str:
    """The first `shown` of `names`, then how many there are in all."""
    more = f" ... ({len(names)} in all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


# ---- reading a model folder -----------------------------------------------------------------
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# A minibert-only model's weights: a name transformers never looks for, so never misreads.
PRE_LN_WEIGHTS_FILE = "minibert-preln.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # sharded: {"weight_map": {name: shard file}}
TORCH_FILE = "pytorch_model.bin"
# The files of an export, which save_pretrained replaces; everything else in the folder stays.
MODEL_FILES = {CONFIG_FILE, WEIGHTS_FILE, PRE_LN_WEIGHTS_FILE, INDEX_FILE, TORCH_FILE,
                "pytorch_model.bin.index.json"}
SHARD_FILE = re.compile(r"^(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)$")
MODEL_FOLDER = (f"a model folder holding {CONFIG_FILE}, the weights ({WEIGHTS_FILE} or "
                f"{TORCH_FILE}) and the tokenizer")
_LFS_POINTER = b"version https://git-lfs"


class NonFiniteWeightsError(ValueError):
    """A weights file holds NaN or infinite values; the message names the tensor and file."""


def check_finite(tensors: Mapping[str, Tensor], file: PathLike,
                 fix: str = "download or export it again") -> None:
    """Refuse NaN or infinity in `tensors`, read from `file`: a NonFiniteWeightsError naming
    the first such tensor, its count of such values and `fix`. Integer tensors pass."""
    for name, t in tensors.items():
        if not (t.is_floating_point() or t.is_complex()):
            continue
        x = t.float() if t.dtype.itemsize == 1 else t  # float8: torch lacks some reductions
        # A sum is not finite whenever a term is, and far cheaper than the elementwise mask,
        # needed only then: to tell large finite weights that overflowed from a NaN.
        if bool(torch.isfinite(x.sum())) or bool(torch.isfinite(x).all()):
            continue
        counts = [f"{n} {what}" for n, what in ((int(torch.isnan(t).sum()), "NaN"),
                                                 (int(torch.isinf(t).sum()), "infinite"))
                  if n]
        raise NonFiniteWeightsError(
            f"{file}: tensor {name} holds {' and '.join(counts)} of its {t.numel()} values; "
            f"the weights are damaged (a bad download, copy or disk) or were saved from a "
            f"run that diverged, and would make every output NaN: {fix}")


def require_safetensors() -> None:
    """Call before training a run that saves a folder at its end: say at once if it cannot."""
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
                                    f"), not a model folder; export one with minibert.interop."
                                    f"export.export_checkpoint({str(path / steps[-1])!r}, OUT)")
        raise FileNotFoundError(f"{cfg} not found; a checkpoint directory holds config.json")
    try:
        d = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg} is not valid JSON ({e}); re-export or repair the file") from None
    if not isinstance(d, dict):
        raise ValueError(f"{cfg} must hold a JSON object, found {type(d).__name__}")
    check_stored_config(d, cfg)
    return d


def check_stored_config(d: dict[str, Any], file: Path) -> None:
    """Refuse, naming `file`, a config.json whose fields BertConfig refuses: a loader checks
    them as the constructor does (Infinity and NaN parse as JSON numbers), before any use;
    and a classifier's `id2label` whose keys are not its class ids."""
    if d.get("id2label") is not None:
        check_id2label(d["id2label"], file)
    try:
        config_from_hf(d)
    except KeyError as e:  # a field ModernBERT's config cannot do without
        raise ValueError(f"{file} lacks {e.args[0]}; re-export or repair the file") from None
    except ValueError as e:
        message = str(e)
        if message.startswith(f"{CONFIG_FILE} "):  # config_from_hf's own: "config.json has ..."
            raise ValueError(f"{file}{message[len(CONFIG_FILE):]}") from None
        field = re.match(r"BertConfig\.(\w+)", message)
        theirs = field and _stored_names(d).get(field.group(1), field.group(1))
        where = f" ({theirs} in the file)" if field and theirs != field.group(1) else ""
        raise ValueError(f"{file}: {message}{where}; repair the file") from None


def check_id2label(labels: Any, file: Path) -> None:
    """Refuse an `id2label` whose keys are not the class ids 0 ... n-1 (JSON writes them as
    strings): a classifier's class i is named by key "i", and other keys name no class, or
    (with a gap) the wrong one."""
    example = '{"0": "neg", "1": "pos"}'
    if not isinstance(labels, dict):
        raise ValueError(f"{file}: id2label is a {type(labels).__name__}; it must map each "
                         f"class id to its name, as {example}; repair the file")
    ids = [str(i) for i in range(len(labels))]
    for key in labels:
        if key not in ids:
            raise ValueError(f"{file}: id2label has the key {key!r}, which is not a class id: "
                             f"its keys are the ids 0 to {len(labels) - 1}, each mapped to "
                             f"its class's name, as {example}; repair the file")


def _stored_names(d: dict[str, Any]) -> dict[str, str]:
    """minibert's field -> its name in `d`, a config.json, where the two differ."""
    if d.get("model_type") == MODERNBERT_MODEL_TYPE:
        return {**{ours: theirs for theirs, ours in _MODERN_NAMES.items()},
                "rope_theta": "global_rope_theta", "rope_local_theta": "local_rope_theta"}
    return {ours: theirs for theirs, ours in _HF_NAMES.items()}


def read_weights(path: PathLike, *, header_only: bool = False) -> dict[str, Tensor]:
    """The tensors of a model folder; a missing file is a FileNotFoundError, a damaged one a
    ValueError, NaN or infinity a NonFiniteWeightsError (a ValueError), each naming it.
    `header_only`: read safetensors' headers alone, each tensor given as a meta tensor of its
    stored shape, which holds no values (`check_weights`)."""
    files = _weight_files(Path(path))
    if files[0].suffix != ".safetensors":
        return _load_torch_file(files[0])
    sd: dict[str, Tensor] = {}
    for file in files:
        sd.update(_load_safetensors(file, header_only))
    return sd


def check_weights(path: PathLike, model: Optional[torch.nn.Module] = None) -> None:
    """Raise what `read_weights` would for missing or damaged files, reading only safetensors'
    headers (byte ranges against the file's size): cheap, before a script's other work. With
    `model` (built on the meta device, it costs no memory), also what `load_hf_state_dict`
    would for a tensor the model lacks, has no place for, or holds in another shape."""
    stored = read_weights(path, header_only=True)
    if model is not None:
        match_hf_state_dict(model, stored, path)


def _weight_files(path: Path) -> list[Path]:
    """A folder's weight files: one safetensors file, else an index's shards, else a pickle."""
    for name in (WEIGHTS_FILE, PRE_LN_WEIGHTS_FILE):
        if file_present(path / name):  # a link to nothing is named, not passed over
            return [path / name]
    if file_present(path / INDEX_FILE):
        return _shard_files(path / INDEX_FILE)
    if file_present(path / TORCH_FILE):
        return [path / TORCH_FILE]
    raise FileNotFoundError(f"no weights in {path}: looked for {WEIGHTS_FILE}, "
                            f"{PRE_LN_WEIGHTS_FILE}, {INDEX_FILE} and {TORCH_FILE}")


def weights_path(folder: Path) -> Path:
    """The file a folder's weights are read from, to name in a message: its one weights
    file, or the index that lists its shards."""
    first = _weight_files(folder)[0]
    sharded = first.name not in (WEIGHTS_FILE, PRE_LN_WEIGHTS_FILE, TORCH_FILE)
    return folder / INDEX_FILE if sharded else first


def _shard_files(index: Path) -> list[Path]:
    """The shard files a safetensors index names, each checked to lie inside its folder."""
    try:
        d = json.loads(index.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{index} is not valid JSON ({e}); download or export the "
                         f"checkpoint again") from None
    weight_map = d.get("weight_map") if isinstance(d, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
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
    """`file`'s tensors, each checked finite; with `header_only`, the header alone is read and
    each tensor is a meta tensor of its stored shape."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ImportError(f"reading {file} needs the safetensors package: "
                          f"pip install 'minibert[hf]'") from None
    try:
        with safe_open(str(file), framework="pt") as f:  # the header is read on opening
            sd = ({name: torch.empty(f.get_slice(name).get_shape(), device="meta")
                   for name in f.keys()} if header_only else
                  {name: f.get_tensor(name) for name in f.keys()})
    except SafetensorError as e:
        raise _damaged(file, "safetensors file", e) from None
    if not header_only:
        check_finite(sd, file)
    return sd


def _load_torch_file(file: Path) -> dict[str, Tensor]:
    """The state dict in a pickled `pytorch_model.bin`, read without running code from it."""
    with open(file, "rb") as f:  # failing to open is an OSError about the file, not damage
        try:
            sd = torch.load(f, map_location="cpu", weights_only=True)
        except MemoryError:
            raise
        except Exception as e:
            # "Unsupported global": a well-formed pickle asking for another object than
            # tensors and plain values (code), refused. Anything else is damage.
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
# What minibert does not compute (other activations, scaled RoPE, a decoder) is refused by name.

# config.json's model_type for Pre-LN BERT and other mixes, which transformers refuses.
PRE_LN_MODEL_TYPE = "minibert-preln"
MINIBERT_MODEL_TYPE = "minibert"
MODERNBERT_MODEL_TYPE = "modernbert"


def model_type(config: BertConfig) -> str:
    """config.json's model_type: "bert" for classic BERT, "modernbert" for every modern switch
    as ModernBERT has it, else a minibert-only type that transformers refuses."""
    if all(getattr(config, k) == v for k, v in MODERN.items() if k not in _MODERN_FREE):
        return MODERNBERT_MODEL_TYPE
    classic = all(getattr(config, k) == v for k, v in _SWITCH_DEFAULTS.items())
    if classic and config.type_vocab_size >= 1:
        return PRE_LN_MODEL_TYPE if config.norm_position == "pre" else "bert"
    return MINIBERT_MODEL_TYPE


def transformers_class(model: torch.nn.Module) -> Optional[str]:
    """The transformers class that loads `model`'s saved folder (`BertForMaskedLM`,
    `ModernBertForMaskedLM`, ...), or None where its config.json's model_type is one that
    transformers refuses (`model_type`): minibert alone loads it."""
    kind = model_type(model.config)
    if kind not in ("bert", MODERNBERT_MODEL_TYPE):
        return None
    return architecture(type(model), kind == MODERNBERT_MODEL_TYPE)


# transformers' name -> minibert's, for the fields both have (renamed: config.HF_RENAMES).
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
    """Refuse, for a masked LM, a config.json whose MLM decoder is a matrix of its own:
    minibert's is the word embeddings. The encoder and the other heads load it."""
    if d.get("tie_word_embeddings", True) is not True:
        raise ValueError("config.json has tie_word_embeddings=false: its MLM decoder is a "
                         "matrix of its own, and minibert's is the word embeddings, as "
                         "BERT's and ModernBERT's are; load it as a BertModel or a "
                         "classifier to use its encoder")


def config_from_hf(d: dict[str, Any], **overrides: Any) -> BertConfig:
    """A config from a BERT or ModernBERT `config.json` dict, with overrides applied."""
    kind = d.get("model_type", "bert")
    for key in ("is_decoder", "add_cross_attention"):  # transformers' decoder switches
        if d.get(key):
            raise ValueError(f"config.json has {key}=true (a decoder: causal attention"
                             f"{' over a second sequence' if key != 'is_decoder' else ''}); "
                             f"minibert implements a bidirectional encoder only")
    if kind == MODERNBERT_MODEL_TYPE:
        return BertConfig(**known_fields({**_from_modernbert(d), **overrides}, "config_from_hf"))
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
    return BertConfig(**known_fields({**fields, **overrides}, "config_from_hf"))


def config_to_hf(config: BertConfig) -> dict[str, Any]:
    """The transformers `config.json` dict for this config (minibert-only fields included)."""
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

# transformers' ModernBERT name -> minibert's, for the fields both have as they are (and
# minibert's attention fields); one a config.json lacks keeps its MODERN or BertConfig default.
_MODERN_NAMES = dict(
    vocab_size="vocab_size", hidden_size="hidden_size", num_hidden_layers="num_layers",
    num_attention_heads="num_heads", intermediate_size="intermediate_size",
    max_position_embeddings="max_position_embeddings", pad_token_id="pad_token_id",
    norm_eps="layer_norm_eps", initializer_range="initializer_range",
    # minibert has one dropout rate for the residual branches, the embeddings and the
    # classifiers (placed as BERT places it), and one for the attention probabilities.
    mlp_dropout="hidden_dropout", attention_dropout="attention_dropout",
    classifier_pooling="classifier_pooling", attention="attention",
    attention_chunk_size="attention_chunk_size")


def _layer_types(n_layers: int, global_every: int) -> list[str]:
    return ["full_attention" if i % global_every == 0 else "sliding_attention"
            for i in range(n_layers)]


def _from_modernbert(d: dict[str, Any]) -> dict[str, Any]:
    """BertConfig fields from a transformers ModernBERT config.json."""
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
    for kind, params in rope.items():  # BertConfig checks the number; float() the type
        if isinstance(params["rope_theta"], bool) or not isinstance(params["rope_theta"],
                                                                     (int, float)):
            raise refuse(f"rope_parameters[{kind!r}]['rope_theta'] (or its legacy key)",
                         params["rope_theta"], "a number")
    fields = {ours: d[theirs] for theirs, ours in _MODERN_NAMES.items() if theirs in d}
    return dict(MODERN, **fields, bias=biases["attention_bias"], global_every=every,
                local_window=window, rope_theta=float(rope["full_attention"]["rope_theta"]),
                rope_local_theta=float(rope["sliding_attention"]["rope_theta"]))


def _to_modernbert(c: BertConfig) -> dict[str, Any]:
    """transformers' ModernBERT config.json for a config with every modern switch turned."""
    return {
        "model_type": MODERNBERT_MODEL_TYPE,
        **{theirs: getattr(c, ours) for theirs, ours in _MODERN_NAMES.items()},
        "hidden_activation": "gelu", "classifier_activation": "gelu",
        "attention_bias": c.bias, "mlp_bias": c.bias, "norm_bias": c.bias,
        "classifier_bias": c.bias, "decoder_bias": True, "tie_word_embeddings": True,
        "local_attention": c.local_window, "global_attn_every_n_layers": c.global_every,
        "layer_types": _layer_types(c.num_layers, c.global_every),
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": c.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": c.rope_local_theta}},
        "global_rope_theta": c.rope_theta, "local_rope_theta": c.rope_local_theta,
        "embedding_dropout": c.hidden_dropout, "classifier_dropout": c.hidden_dropout}
