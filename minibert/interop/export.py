"""A training checkpoint (`checkpoints/step_N`) turned into a model folder.

`export_checkpoint` rebuilds the model class a checkpoint of the training loop holds and saves
it with `save_pretrained`, together with the run's tokenizer, so the folder is what the run's
final/ would be: it loads with `from_pretrained`, fine-tunes with the scripts' --init-from,
and loads in transformers (model and AutoTokenizer) for BERT's and ModernBERT's
architectures (`hf.model_type`).
It sits above the model and its heads, which it builds.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Union


from ..model import heads
from ..training.checkpoint import STATE_FILE, load_checkpoint
from ..training.state import Saved
from ..model.config import BertConfig
from .hf import (PathLike, check_finite, check_mappable, error_gist, is_adapter_name,
                 is_modernbert, model_prefix)
from ..model.model import BertModel
from .pretrained import PretrainedMixin, check_tokenizer_fits
from ..data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)



def exportable() -> dict[str, type]:
    """The classes a checkpoint can name, under the name it records (`hf.minibert_class`):
    BertModel and every public model class of heads.py, so that a head added there exports
    with nothing added here (docs/walkthrough.md, "Adding a head")."""
    found = [c for c in vars(heads).values() if isinstance(c, type) and
             issubclass(c, PretrainedMixin) and c.__module__ == heads.__name__ and
             not c.__name__.startswith("_")]
    return {c.__name__: c for c in [BertModel, *found]}


def export_checkpoint(checkpoint_dir: PathLike, out_dir: PathLike,
                      model_class: Optional[str] = None,
                      tokenizer: Union[Tokenizer, PathLike, None] = None) -> Path:
    """Write the model of a training checkpoint (`RUN/checkpoints/step_N`) and its run's
    tokenizer as a model folder; return the folder.

    The class is `model_class`, else the one the checkpoint records (the training loop
    records it in every checkpoint). A classifier's number of labels
    comes from its weights, its class names from the checkpoint (LABEL_i where it has none).

    The tokenizer is `tokenizer` (a Tokenizer or its folder), else the run's: RUN/tokenizer,
    where the scripts keep it (distill.py's baseline/ run: its outer run's). Either must be
    the one the checkpoint records in its run identity (the scripts record its
    fingerprint), else export refuses, naming both. When there is none to carry (a
    checkpoint saved outside a run folder), a warning says so and the folder holds the
    model only: pass `tokenizer` for a folder the fine-tuning scripts and transformers'
    AutoTokenizer can read.

    Weights that hold NaN or infinity are refused (`hf.NonFiniteWeightsError`).
    """
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
        names = state.id2label
        if names and len(names) == kwargs["num_labels"]:
            kwargs["id2label"] = names
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
                       _run_folder(checkpoint_dir) / "tokenizer", out_dir)
    model.save_pretrained(out_dir, tokenizer=tok)
    return Path(out_dir)


def _run_folder(checkpoint_dir: Path) -> Path:
    """RUN, for a checkpoint RUN/checkpoints/step_N."""
    return checkpoint_dir.parent.parent


def _run_tokenizer(checkpoint_dir: Path, state: Saved,
                   given: Union[Tokenizer, PathLike, None],
                   config: BertConfig) -> Optional[Tokenizer]:
    """The tokenizer to export with the checkpoint's model: `given`, else the run's, checked
    against the fingerprint the checkpoint's run identity records; None when there is none.

    The run's is RUN/tokenizer, or, for a run inside another (distill.py's baseline/), the
    outer run's, when its fingerprint is the one recorded."""
    identity = state.data_identity
    recorded = identity.get("tokenizer") if isinstance(identity, dict) else None
    if isinstance(given, Tokenizer):
        candidates = [(given, "the tokenizer given")]
    elif given is not None:
        candidates = [(Tokenizer.from_pretrained(given), str(given))]
    else:
        run = _run_folder(checkpoint_dir)
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
