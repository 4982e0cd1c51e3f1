"""A training checkpoint (`checkpoints/step_N`) turned into a model folder.

`export_checkpoint` rebuilds a checkpoint's model (so it sits above the model and heads) and
saves it with the run's tokenizer, as the run's final/ would be (docs/runs.md).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Union

from ..data.tokenizer import Tokenizer
from ..model import heads
from ..model.config import BertConfig
from ..model.model import BertModel
from ..training.checkpoint import STATE_FILE, load_checkpoint
from ..training.state import Saved
from .hf import (PathLike, check_finite, check_mappable, error_gist, is_adapter_name,
                 is_modernbert, model_prefix)
from .pretrained import PretrainedMixin, check_tokenizer_fits

logger = logging.getLogger(__name__)


def exportable() -> dict[str, type]:
    """BertModel and every public model class of heads.py, under the names checkpoints record:
    a head added there exports with nothing added here (docs/walkthrough.md, "Adding a head")."""
    found = [c for c in vars(heads).values() if isinstance(c, type) and
             issubclass(c, PretrainedMixin) and c.__module__ == heads.__name__ and
             not c.__name__.startswith("_")]
    return {c.__name__: c for c in [BertModel, *found]}


def export_checkpoint(checkpoint_dir: PathLike, out_dir: PathLike,
                      model_class: Optional[str] = None,
                      tokenizer: Union[Tokenizer, PathLike, None] = None) -> Path:
    """Write the model of `RUN/checkpoints/step_N` (the class it records, or `model_class`)
    and its run's tokenizer as a model folder, and return it. The tokenizer is `tokenizer` (a
    Tokenizer or its folder) else RUN/tokenizer, and must be the one the run recorded; with
    none, a warning says so. NaN or infinite weights are refused (`hf.NonFiniteWeightsError`)."""
    checkpoint_dir = Path(checkpoint_dir)
    state = Saved.of(load_checkpoint(checkpoint_dir))  # verified by meta.json, weights-only
    weights, config = state.weights, state.model_config
    if not isinstance(weights, dict) or not isinstance(config, dict):
        raise ValueError(f"checkpoint {checkpoint_dir} has no 'model' and 'model_config' "
                         f"entries; export handles checkpoints of minibert's training loop")
    # A model folder of NaN weights would only be refused where it is loaded.
    check_finite(weights, checkpoint_dir / STATE_FILE,
                 fix="export an earlier checkpoint of the run, from before it diverged")
    name, classes = model_class or state.model_class, exportable()
    if name is None:
        raise ValueError(f"checkpoint {checkpoint_dir} records no model class (it was not "
                         f"saved by minibert's training loop); pass model_class= one of "
                         f"{sorted(classes)}")
    if name not in classes:
        raise ValueError(f"model_class={name!r} is not one of {sorted(classes)}; a model of your "
                         f"own is not rebuilt here: its weights are minibert.training.checkpoint."
                         f"load_checkpoint({str(checkpoint_dir)!r})['model']")
    try:
        bert_config = BertConfig(**config)
    except TypeError as e:
        raise ValueError(f"checkpoint {checkpoint_dir}: its model_config does not fit this "
                         f"minibert's BertConfig ({e})") from None
    cls, kwargs = classes[name], {}
    if issubclass(cls, heads.Labelled) and "classifier.weight" in weights:
        kwargs["num_labels"] = weights["classifier.weight"].shape[0]  # (C, H)
        if state.id2label and len(state.id2label) == kwargs["num_labels"]:
            kwargs["id2label"] = state.id2label
    model = cls(bert_config, **kwargs)
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if any(is_adapter_name(n) for n in unexpected):
        check_mappable((model_prefix(model) + n for n in weights),
                       is_modernbert(model), f"checkpoint {checkpoint_dir}")
    if missing or unexpected:
        raise ValueError(f"checkpoint {checkpoint_dir} does not hold a {name} (missing "
                         f"{missing[:2]}, unexpected {unexpected[:2]}); pass model_class= "
                         f"one of {sorted(classes)}")
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        raise ValueError(f"checkpoint {checkpoint_dir}: its weights do not fit its "
                         f"model_config ({error_gist(e)})") from None
    tok = _run_tokenizer(checkpoint_dir, state, tokenizer, bert_config)
    if tok is None:
        logger.warning("%s: no tokenizer to carry (there is no %s), so %s holds the model "
                       "only; the fine-tuning scripts refuse it and transformers' "
                       "AutoTokenizer cannot read it. Pass tokenizer= (the run's Tokenizer or "
                       "its folder) to export_checkpoint", checkpoint_dir,
                       checkpoint_dir.parent.parent / "tokenizer", out_dir)
    model.save_pretrained(out_dir, tokenizer=tok)
    return Path(out_dir)


def _run_tokenizer(checkpoint_dir: Path, state: Saved, given: Union[Tokenizer, PathLike, None],
                   config: BertConfig) -> Optional[Tokenizer]:
    """`given`, else RUN/tokenizer (or the outer run's, for distill.py's baseline/), checked
    against the fingerprint the checkpoint's run recorded; None when there is none."""
    recorded = (state.data_identity or {}).get("tokenizer")
    if isinstance(given, Tokenizer):
        candidates = [(given, "the tokenizer given")]
    elif given is not None:
        candidates = [(Tokenizer.from_pretrained(given), str(given))]
    else:
        run = checkpoint_dir.parent.parent  # RUN, of RUN/checkpoints/step_N
        places = [run / "tokenizer"] + ([run.parent / "tokenizer"] if recorded else [])
        candidates = [(Tokenizer.from_pretrained(p), str(p)) for p in places
                      if (p / "tokenizer.json").is_file()]
        if not candidates:
            return None
    for tok, _ in candidates:
        if tok.fingerprint == recorded:
            return tok
    tok, source = candidates[0]
    if recorded is None:  # nothing to compare with: at least it must fit the model
        check_tokenizer_fits(config, tok, what=f"checkpoint {checkpoint_dir}'s model")
        return tok
    raise ValueError(f"{source} is not the tokenizer of checkpoint {checkpoint_dir}: its run "
                     f"was trained with the tokenizer of fingerprint {recorded[:16]}, this one "
                     f"is {tok.fingerprint[:16]} ({tok.vocab_size} tokens), and its ids would "
                     f"not be the model's. Pass tokenizer= the run's own")
