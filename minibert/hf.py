"""Checkpoints in transformers' layout: name translation and safe loading.

A transformers BERT checkpoint is a directory with `config.json` and `model.safetensors`
(or the older pickled `pytorch_model.bin`). This module reads and writes that layout, so a
minibert model loads `bert-base-uncased` or a compact BERT, and transformers loads what
minibert saves, with the same outputs.

minibert's parameter names are its own (`bert.blocks.3.attn.qkv.weight`); the translation to
transformers' names is one table, `_RENAMES`, plus one structural difference: minibert fuses
the query, key and value projections into one matrix, which transformers stores as three.

Loading never runs pickled code: safetensors holds only tensors, and `pytorch_model.bin` is
read with `torch.load(weights_only=True)`, which refuses arbitrary objects.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any, Union

import torch
from torch import Tensor

from .config import BertConfig

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

# minibert name -> transformers name, applied in order to names that start with "bert." (the
# encoder), "head." (MLM head) or "classifier." (classification head).
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
]
_QKV = re.compile(r"^bert\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")


def hf_names(name: str) -> list[str]:
    """transformers' name(s) for one minibert parameter name (three for a fused QKV)."""
    m = _QKV.match(name)
    if m:
        layer, kind = m.groups()
        return [f"bert.encoder.layer.{layer}.attention.self.{p}.{kind}"
                for p in ("query", "key", "value")]
    for pattern, repl in _RENAMES:
        if re.match(pattern, name):
            return [re.sub(pattern, repl, name)]
    return [name]  # classifier.weight / classifier.bias are the same in both


def _canonical(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Bring a transformers state dict to one form: `bert.`-prefixed, weight/bias names.

    A checkpoint saved from a bare `BertModel` has no `bert.` prefix; very old ones (the
    original TF conversions) call LayerNorm parameters gamma and beta.
    """
    out = {}
    for key, t in sd.items():
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
        key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
        if key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = "bert." + key
        out[key] = t
    return out


def _model_prefix(model: torch.nn.Module) -> str:
    # A bare BertModel's parameters are named `embeddings...`; wrapped ones `bert.embeddings...`.
    return "bert." if type(model).__name__ == "BertModel" else ""


def to_hf_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The model's weights under transformers' names (fused QKV split into three)."""
    prefix = _model_prefix(model)
    out: dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        names = hf_names(prefix + name)
        for hf_name, part in zip(names, t.chunk(len(names), dim=0)):
            if type(model).__name__ == "BertModel":
                hf_name = hf_name.removeprefix("bert.")  # transformers' BertModel has no prefix
            out[hf_name] = part.detach().to("cpu").contiguous().clone()
    return out


def load_hf_state_dict(model: torch.nn.Module, sd: dict[str, Tensor]) -> None:
    """Copy a transformers-layout state dict into `model`, with clear errors and warnings."""
    sd = _canonical(sd)
    if "cls.predictions.bias" not in sd and "cls.predictions.decoder.bias" in sd:
        sd["cls.predictions.bias"] = sd["cls.predictions.decoder.bias"]
    prefix = _model_prefix(model)
    own = model.state_dict()
    new, missing = {}, []
    for name, param in own.items():
        names = hf_names(prefix + name)
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
    fresh = ("bert.pooler.", "pooler.", "head.", "classifier.")
    broken = [n for n in missing if not n.startswith(fresh)]
    if broken:
        raise ValueError(f"checkpoint lacks {len(broken)} encoder weight(s), e.g. "
                         f"{[hf_names(prefix + n)[0] for n in broken[:3]]}; is it a BERT "
                         f"checkpoint with the same number of layers?")
    if missing:
        logger.warning("newly initialised (not in the checkpoint), train before use: %s",
                       sorted({n.rsplit(".", 1)[0] for n in missing}))
    model.load_state_dict(new, strict=False)


# ---- files ----------------------------------------------------------------------------------

def read_config(path: PathLike) -> dict[str, Any]:
    """The parsed `config.json` of a checkpoint directory, with errors that name the file."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist (or is not "
                                f"a directory); expected config.json and model.safetensors "
                                f"or pytorch_model.bin inside it")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"{cfg} not found; a checkpoint directory holds config.json")
    try:
        d = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg} is not valid JSON ({e}); re-export or repair the file") from None
    if not isinstance(d, dict):
        raise ValueError(f"{cfg} must hold a JSON object, found {type(d).__name__}")
    return d


def read_weights(path: PathLike) -> dict[str, Tensor]:
    """The tensors of a checkpoint directory: safetensors preferred, pickles only as weights."""
    path = Path(path)
    st, index, pt = path / "model.safetensors", path / "model.safetensors.index.json", \
        path / "pytorch_model.bin"
    if st.is_file():
        return _load_safetensors(st)
    if index.is_file():  # sharded: {"weight_map": {name: shard file}}
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        sd: dict[str, Tensor] = {}
        for shard in shards:
            sd.update(_load_safetensors(path / shard))
        return sd
    if pt.is_file():
        try:
            sd = torch.load(pt, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise ValueError(f"{pt} holds pickled objects other than tensors; refusing to "
                             f"unpickle them, since that could run arbitrary code. Re-save "
                             f"the weights as a plain state dict or as safetensors. ({e})"
                             ) from None
        if not isinstance(sd, dict) or not all(isinstance(t, Tensor) for t in sd.values()):
            raise ValueError(f"{pt} does not hold a state dict (name -> tensor)")
        return sd
    raise FileNotFoundError(f"no weights in {path}: looked for model.safetensors, "
                            f"model.safetensors.index.json and pytorch_model.bin")


def _load_safetensors(file: Path) -> dict[str, Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ImportError(f"reading {file} needs the safetensors package: "
                          f"pip install 'minibert[hf]'") from None
    return load_file(str(file))


def _write_atomic(file: Path, write) -> None:
    # Write beside the target, then rename: a crash never leaves a half-written checkpoint.
    tmp = file.with_name(file.name + ".tmp")
    write(tmp)
    os.replace(tmp, file)


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
        (with a warning); weights missing from the encoder are an error.
        """
        hf_config = read_config(path)
        init_kwargs = cls._init_kwargs(hf_config, config_overrides)
        config = BertConfig.from_hf_dict(hf_config, **config_overrides)
        model = cls(config, **init_kwargs)
        load_hf_state_dict(model, read_weights(path))
        return model

    def save_pretrained(self, path: PathLike) -> None:
        """Write `config.json` + `model.safetensors` that transformers loads unchanged."""
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ImportError("save_pretrained writes safetensors: pip install 'minibert[hf]'"
                              ) from None
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        config = self.config.to_hf_dict()
        config.update(architectures=[type(self).__name__], tie_word_embeddings=True,
                      **self._hf_config_extras())
        state = to_hf_state_dict(self)
        _write_atomic(path / "model.safetensors",
                      lambda f: save_file(state, str(f), metadata={"format": "pt"}))
        _write_atomic(path / "config.json",
                      lambda f: f.write_text(json.dumps(config, indent=2) + "\n"))
