"""BLiMP: what a masked LM knows of grammar, scored zero-shot on minimal pairs.

    paradigms = read_blimp("blimp/data")                    # paradigm -> [MinimalPair, ...]
    result = evaluate_blimp(model, tok, paradigms, max_pairs=100)
    result.overall, result.paradigms["passive_1"], result.fields["morphology"]

BLiMP (Warstadt et al. 2020, "BLiMP: The Benchmark of Linguistic Minimal Pairs for English")
holds 67 paradigms of 1,000 pairs: two sentences that differ in one place, one acceptable and
one not ("Karla could listen to herself." / "... himself."). A model knows the contrast when
it scores the good sentence higher; no training, no classifier.

An MLM gives no left-to-right probability of a sentence, so the score is the
pseudo-log-likelihood (Salazar et al. 2020, "Masked Language Model Scoring"): mask each token
in turn and add up the log-probability the model gives the original token in its place,

    PLL(w_1 .. w_n) = sum_i log P(w_i | w_1 .. w_{i-1}, [MASK], w_{i+1} .. w_n).

Every term sees the whole sentence but the token it predicts, which is exactly the task the
model was pretrained on; the sentence costs n forward passes, one per masked copy, and those
copies are batched across sentences. The scores equal a loop over transformers' models on the
same weights (tests/test_blimp.py). Shapes: S sentences, R masked copies in a forward (the
batch), T tokens with [CLS] and [SEP], V the model's vocabulary rows.

The reader takes BLiMP's layout: a folder of `*.jsonl` files, one paradigm each, one pair a
line (`sentence_good`, `sentence_bad`, `field`, `UID`, `pairID`, ...); docs/quality.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..atomic import PathLike
from ..data.task_files import _Object
from ..data.text import read_text
from ..data.tokenizer import Tokenizer
from ..machine.precision import autocast_context, resolve_precision
from ..paths import check_readable, file_present

logger = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".jsonl.gz")  # a paradigm file, plain or gzipped (read as a stream)
# Rows (masked copies) per forward: BLiMP's sentences are short (about 8 tokens), so 256
# copies are about 30 sentences, a few MB of activations for the mini preset.
DEFAULT_BATCH_SIZE = 256
UNKNOWN_FIELD = "unknown"


# ---- the pairs -------------------------------------------------------------------------------

class MinimalPair(NamedTuple):
    """One line of a paradigm file: the acceptable sentence and its unacceptable twin."""

    good: str
    bad: str
    paradigm: str  # the file's name without .jsonl (BLiMP names each file by its UID)
    field: str  # `field`, else `linguistics_term`, else "unknown"
    pair_id: str  # `pairID`, else the line number
    line: int  # the line of the file, from 1


def read_blimp(folder: PathLike) -> dict[str, list[MinimalPair]]:
    """Every paradigm of a BLiMP folder: `{paradigm: pairs}`, by file name, pairs in file
    order. Each `*.jsonl` file is one paradigm; anything else in the folder is not read. A
    folder of none, a line that is not a JSON object, a missing or empty sentence: refused,
    naming the file and the line."""
    root = Path(folder).expanduser()
    check_readable(root)  # a loop, a link to nothing, a folder that may not be entered: named
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is a file; give the folder of BLiMP's paradigm "
                                 f"files (one *.jsonl file per paradigm)")
    files = sorted(p for p in root.iterdir() if p.name.endswith(SUFFIXES) and file_present(p))
    if not files:
        shown = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
        zipped = [n for n in shown if n.endswith((".jsonl.bz2", ".jsonl.xz"))]
        held = (f"it holds {', '.join(shown[:5])}{', ...' if len(shown) > 5 else ''}"
                if shown else "it is empty")
        fix = "; decompress them first, or gzip them" if zipped else ""
        raise FileNotFoundError(f"{root} holds no paradigm files (*.jsonl or *.jsonl.gz, one "
                                f"paradigm a file, one pair a line); {held}{fix}")
    paradigms: dict[str, list[MinimalPair]] = {}
    for p in files:
        name = _paradigm_name(p)
        if name in paradigms:
            raise ValueError(f"{root} holds paradigm {name!r} twice, plain and gzipped; keep "
                             f"one of the two files")
        paradigms[name] = read_paradigm(p)
    return paradigms


def _paradigm_name(path: Path) -> str:
    """A paradigm file's name without its suffix: BLiMP names each file by its UID."""
    return path.name.removesuffix(".gz").removesuffix(".jsonl")


def read_paradigm(path: PathLike) -> list[MinimalPair]:
    """The pairs of one paradigm file, one JSON object a line (blank lines are skipped).
    Every line must carry the same `UID` where it has one: a file is one paradigm."""
    path = Path(path)
    name = _paradigm_name(path)
    pairs: list[MinimalPair] = []
    uid: Optional[tuple[str, int]] = None  # the first line's UID, and that line
    # JSON: a \r alone is whitespace between tokens, no line end to refuse.
    text = read_text(path, line_ends=False)
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:  # an _Object records the keys given twice, of which json.loads keeps the last
            item = json.loads(line, object_pairs_hook=_Object.from_pairs)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {n}: not JSON ({e.msg}, column {e.colno}); "
                             f"expected one JSON object per line") from None
        if not isinstance(item, dict):
            raise ValueError(f"{path}, line {n}: a JSON {type(item).__name__} where a pair's "
                             f"object is expected ({{\"sentence_good\": ..., "
                             f"\"sentence_bad\": ...}})")
        if item.repeated:
            raise ValueError(f"{path}, line {n}: the key {min(item.repeated)!r} is given "
                             f"twice; JSON keeps only the last, so delete the one that is wrong")
        good, bad = (_sentence(item, key, path, n) for key in ("sentence_good", "sentence_bad"))
        if isinstance(item.get("UID"), str):
            if uid is None:
                uid = (item["UID"], n)
            elif item["UID"] != uid[0]:
                raise ValueError(f"{path}, line {n}: UID {item['UID']!r}, but line {uid[1]} "
                                 f"has {uid[0]!r}; a file holds one paradigm, so split it")
        pairs.append(MinimalPair(good, bad, name, _field_of(item), str(item.get("pairID", n)),
                                 n))
    if not pairs:
        raise ValueError(f"{path} holds no pairs; expected one JSON object per line with "
                         f"sentence_good and sentence_bad")
    return pairs


def _sentence(item: dict, key: str, path: Path, line: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        what = "no" if key not in item else f"a {type(value).__name__} (not text) as its"
        raise ValueError(f"{path}, line {line}: {what} {key!r}; each line is a pair with "
                         f"sentence_good and sentence_bad")
    if not value.strip():
        raise ValueError(f"{path}, line {line}: {key!r} is empty")
    return value


def _field_of(item: dict) -> str:
    """The group a pair is reported under: BLiMP's `field` (morphology, syntax, semantics,
    syntax-semantics); copies without it (BabyLM's filtered BLiMP, the supplement) group by
    `linguistics_term`, and pairs with neither under "unknown"."""
    for key in ("field", "linguistics_term"):
        if isinstance(item.get(key), str) and item[key].strip():
            return item[key]
    return UNKNOWN_FIELD


def sample_pairs(paradigms: Mapping[str, Sequence[MinimalPair]], max_pairs: Optional[int],
                 seed: int = 0) -> dict[str, list[MinimalPair]]:
    """At most `max_pairs` pairs of each paradigm (None: all), in file order.

    The sample is the same on every machine and Python: the pairs are ranked by a hash of
    (`seed`, their index in the file), not by a random generator whose stream may change
    between versions, and the first `max_pairs` kept. A larger `max_pairs` holds the smaller
    sample, so accuracies at 50 and at 200 pairs are measured on nested sets."""
    if max_pairs is None:
        return {name: list(pairs) for name, pairs in paradigms.items()}
    if not isinstance(max_pairs, int) or isinstance(max_pairs, bool) or max_pairs < 1:
        raise ValueError(f"max_pairs={max_pairs!r} must be a whole number >= 1, or None for "
                         f"every pair")

    def rank(i: int) -> bytes:
        return hashlib.sha256(f"{seed}:{i}".encode()).digest()

    out = {}
    for name, pairs in paradigms.items():
        chosen = sorted(sorted(range(len(pairs)), key=rank)[:max_pairs])
        out[name] = [pairs[i] for i in chosen]
    return out


# ---- pseudo-log-likelihood -------------------------------------------------------------------

@torch.no_grad()
def pseudo_log_likelihood(model: nn.Module, tokenizer: Tokenizer, sentences: Sequence[str], *,
                          batch_size: int = DEFAULT_BATCH_SIZE,
                          precision: str = "fp32") -> list[float]:
    """The PLL of each sentence (Salazar et al. 2020), a float <= 0 each, in input order.

    Each sentence is tokenized as `[CLS] w_1 .. w_n [SEP]`; copy i has w_i replaced by [MASK]
    and adds log_softmax(logits at i)[w_i] (over all V rows of the decoder) to the sum.
    [CLS] and [SEP] are never masked: they are the same in every sentence, and BERT never
    learned to predict them. The copies of all sentences are put in one sequence, ordered by
    length, and cut into forwards of `batch_size` rows, padded to the longest row of each
    with `attention_mask` 0: a sentence's score does not depend on its neighbours (to fp32
    rounding). Sentences that encode alike are scored once, so their scores are equal.

    model: a masked LM called as `model(input_ids, attention_mask, labels=labels)`, with
        `.logits` either (N, V), the labelled positions only (minibert's sparse prediction,
        which runs the decoder on one position per copy instead of T), or (R, T, V). It is
        put in eval mode (dropout off) and back; its device is the one of its parameters. A
        model that says it decodes no vocabulary (an encoder, a classifier) is refused.
    precision: "fp32" (the default, exact), "bf16", "fp16" or "auto", an autocast around the
        forward (`machine.precision`); the log-softmax is always taken in fp32.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a whole number >= 1 (masked "
                         f"copies per forward)")
    # minibert's and transformers' models say whether they decode the vocabulary; a module of
    # one's own that does not say is taken at its word.
    decoder = getattr(model, "get_output_embeddings", None)
    if decoder is not None and decoder() is None:
        raise TypeError(f"{type(model).__name__} has no masked LM head to predict a masked "
                        f"token with; a PLL needs a masked LM (minibert.BertForMaskedLM, or "
                        f"transformers' *ForMaskedLM)")
    device = next(model.parameters()).device
    precision = resolve_precision(precision, device)
    encoded = _encode(tokenizer, sentences, _max_positions(model))
    # Sentences the tokenizer makes one (words outside its vocabulary, all [UNK]) are scored
    # once: the same PLL to the bit, so that their pair ties whatever shares their forwards.
    distinct: dict[tuple[int, ...], int] = {}
    which = [distinct.setdefault(tuple(x), len(distinct)) for x in encoded]  # (S,) -> distinct
    ids = [list(x) for x in distinct]
    # Every masked copy is (sentence, position): the positions 1 .. n of each sentence, the
    # sentences shortest first (stable), so that rows of one forward need little padding.
    order = sorted(range(len(ids)), key=lambda s: len(ids[s]))
    rows = [(s, i) for s in order for i in range(1, len(ids[s]) - 1)]
    T = max(len(x) for x in ids)
    padded = torch.full((len(ids), T), tokenizer.pad_id, dtype=torch.long)  # (S, T)
    for s, x in enumerate(ids):
        padded[s, :len(x)] = torch.tensor(x)
    lengths = torch.tensor([len(x) for x in ids])  # (S,)
    # Summed in float64: a sentence adds up to ~40 terms; the order of the sum is fixed.
    totals = torch.zeros(len(ids), dtype=torch.float64)
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    try:
        for b0 in range(0, len(rows), batch_size):
            sent = torch.tensor([s for s, _ in rows[b0:b0 + batch_size]])  # (R,)
            pos = torch.tensor([i for _, i in rows[b0:b0 + batch_size]])  # (R,)
            t = int(lengths[sent].max())
            input_ids = padded[sent, :t].clone()  # (R, t)
            attention_mask = (torch.arange(t)[None, :] < lengths[sent][:, None]).long()
            r = torch.arange(len(sent))
            targets = input_ids[r, pos].clone()  # (R,): the token each copy hides
            input_ids[r, pos] = tokenizer.mask_id
            labels = torch.full_like(input_ids, -100)  # IGNORE_INDEX but at the masked token
            labels[r, pos] = targets
            with autocast_context(precision, device):
                logits = model(input_ids.to(device), attention_mask.to(device),
                               labels=labels.to(device)).logits
            if logits.dim() == 3:  # (R, t, V): every position's prediction; keep the masked
                logits = logits[r.to(device), pos.to(device)]
            if logits.shape[0] != len(sent):
                raise ValueError(f"the model's logits have {logits.shape[0]} rows for "
                                 f"{len(sent)} masked copies; expected (N, V) or (R, T, V)")
            log_probs = F.log_softmax(logits.float(), dim=-1)  # (R, V)
            picked = log_probs.gather(1, targets.to(device)[:, None])[:, 0]  # (R,)
            totals.index_add_(0, sent, picked.double().cpu())
    finally:
        model.train(was_training)
    logger.debug("PLL of %d sentences: %d masked copies in %.1f s", len(ids), len(rows),
                 time.perf_counter() - start)
    return [float(totals[k]) for k in which]


def _encode(tokenizer: Tokenizer, sentences: Sequence[str], limit: Optional[int]
            ) -> list[list[int]]:
    """`[CLS] .. [SEP]` ids of each sentence; refused where none is left between them, or
    where it is longer than the model's positions (a cut sentence would be scored as another)."""
    if isinstance(sentences, str):
        raise TypeError("sentences is one str; pass a list of sentences")
    if len(sentences) == 0:
        raise ValueError("sentences is empty; a PLL needs at least one sentence")
    ids = tokenizer(list(sentences))["input_ids"]
    for s, x in enumerate(ids):
        if len(x) < 3 or x[0] != tokenizer.cls_id or x[-1] != tokenizer.sep_id:
            raise ValueError(f"sentence {s} ({sentences[s]!r}) encodes to {len(x)} tokens "
                             f"with no word between [CLS] and [SEP]; there is nothing to score")
        if limit is not None and len(x) > limit:
            raise ValueError(f"sentence {s} ({sentences[s][:60]!r}) is {len(x)} tokens with "
                             f"[CLS] and [SEP], more than the model's "
                             f"max_position_embeddings={limit}")
    return ids


def _max_positions(model: nn.Module) -> Optional[int]:
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None)


# ---- pairs, accuracies -----------------------------------------------------------------------

class PairScore(NamedTuple):
    """A pair and the PLL of each of its sentences."""

    pair: MinimalPair
    good: float
    bad: float

    @property
    def correct(self) -> bool:
        """The good sentence scores strictly higher: a tie (and a NaN) counts as wrong, as
        in lm-evaluation-harness's BLiMP, so a model that scores every sentence alike gets 0,
        not 1."""
        return self.good > self.bad


def score_pairs(model: nn.Module, tokenizer: Tokenizer,
                paradigms: Mapping[str, Sequence[MinimalPair]], *,
                batch_size: int = DEFAULT_BATCH_SIZE, precision: str = "fp32"
                ) -> list[PairScore]:
    """Both sentences of every pair scored by `pseudo_log_likelihood`, in one pass (the
    forwards batch across paradigms); pairs in the order of `paradigms`."""
    pairs = [p for ps in paradigms.values() for p in ps]
    if not pairs:
        raise ValueError("no pairs to score")
    sentences = [s for p in pairs for s in (p.good, p.bad)]
    pll = pseudo_log_likelihood(model, tokenizer, sentences, batch_size=batch_size,
                                precision=precision)
    return [PairScore(p, pll[2 * k], pll[2 * k + 1]) for k, p in enumerate(pairs)]


@dataclasses.dataclass(frozen=True)
class BlimpResult:
    """Accuracies in [0, 1] of a set of scored pairs.

    paradigms: per paradigm, the share of its pairs scored correctly.
    fields: per field, the share of the field's pairs (a mean over pairs, as BLiMP's paper
        and BabyLM's evaluation pipeline count a field).
    overall: the mean of the paradigm accuracies (BabyLM's BLiMP average), so a paradigm
        counts once however many of its pairs were scored. On BLiMP, or with `max_pairs`,
        every paradigm has as many pairs and this is also the mean over pairs.
    pairs / field_of: per paradigm, the pairs scored and the field it reports under (its
        first pair's, for the table); field_pairs: per field, the pairs scored.
    scores: the scored pairs themselves, each sentence's PLL.
    """

    overall: float
    paradigms: dict[str, float]
    fields: dict[str, float]
    pairs: dict[str, int]
    field_of: dict[str, str]
    field_pairs: dict[str, int]
    scores: list[PairScore] = dataclasses.field(default_factory=list, repr=False,
                                                compare=False)

    def to_dict(self) -> dict:
        """The accuracies as results.json writes them (no per-sentence scores), with the
        pairs whose two sentences score the same (`tied`, counted wrong)."""
        return {"overall": self.overall, "pairs": sum(self.pairs.values()),
                "tied": _ties(self.scores),
                "paradigms": {name: {"field": self.field_of[name], "accuracy": acc,
                                     "pairs": self.pairs[name]}
                              for name, acc in self.paradigms.items()},
                "fields": {name: {"accuracy": acc, "pairs": self.field_pairs[name]}
                           for name, acc in self.fields.items()}}

    def to_markdown(self) -> str:
        """Tables of the paradigms, the fields and the overall accuracy, in percent."""
        lines = ["| paradigm | field | pairs | accuracy |", "|---|---|---:|---:|"]
        lines += [f"| {name} | {self.field_of[name]} | {self.pairs[name]} | {100 * acc:.1f} |"
                  for name, acc in self.paradigms.items()]
        lines += ["", "| field | pairs | accuracy |", "|---|---:|---:|"]
        lines += [f"| {name} | {self.field_pairs[name]} | {100 * acc:.1f} |"
                  for name, acc in self.fields.items()]
        lines += ["", f"**Overall** (the mean of {len(self.paradigms)} paradigms, "
                      f"{sum(self.pairs.values())} pairs): {100 * self.overall:.1f}"]
        return "\n".join(lines) + "\n"


def _ties(scores: Sequence[PairScore]) -> int:
    """The pairs whose two sentences have the same PLL."""
    return sum(s.good == s.bad for s in scores)


def blimp_accuracy(scores: Sequence[PairScore]) -> BlimpResult:
    """The accuracies of `scores` per paradigm, per field and overall (`BlimpResult`)."""
    if not scores:
        raise ValueError("no scored pairs; an accuracy of nothing is undefined")
    right: dict[str, list[bool]] = defaultdict(list)
    by_field: dict[str, list[bool]] = defaultdict(list)
    field_of: dict[str, str] = {}
    for s in scores:
        right[s.pair.paradigm].append(s.correct)
        by_field[s.pair.field].append(s.correct)
        field_of.setdefault(s.pair.paradigm, s.pair.field)
    bad = sum(not (math.isfinite(s.good) and math.isfinite(s.bad)) for s in scores)
    if bad:
        logger.warning("%d of %d pairs have a score that is not finite (counted wrong): "
                       "are the model's weights finite?", bad, len(scores))
    tied = _ties(scores)
    if tied:
        logger.warning("%d of %d pairs score the same for both sentences (counted wrong): "
                       "most often the tokenizer encodes the two alike, the words that differ "
                       "being outside its vocabulary ([UNK])", tied, len(scores))
    paradigms = {name: sum(r) / len(r) for name, r in right.items()}
    return BlimpResult(overall=sum(paradigms.values()) / len(paradigms),
                       paradigms=paradigms,
                       fields={name: sum(r) / len(r) for name, r in sorted(by_field.items())},
                       pairs={name: len(r) for name, r in right.items()},
                       field_of=field_of,
                       field_pairs={name: len(r) for name, r in sorted(by_field.items())},
                       scores=list(scores))


def evaluate_blimp(model: nn.Module, tokenizer: Tokenizer,
                   paradigms: Mapping[str, Sequence[MinimalPair]], *,
                   max_pairs: Optional[int] = None, seed: int = 0,
                   batch_size: int = DEFAULT_BATCH_SIZE, precision: str = "fp32") -> BlimpResult:
    """Score `paradigms` (`read_blimp`'s, read once) with `model`, at most `max_pairs` pairs
    of each (`sample_pairs`: the same sample every call, so an accuracy logged at each
    evaluation of a run is measured on the same pairs), and return the accuracies with the
    per-sentence scores in `.scores`."""
    chosen = sample_pairs(paradigms, max_pairs, seed)
    start = time.perf_counter()
    scores = score_pairs(model, tokenizer, chosen, batch_size=batch_size, precision=precision)
    result = blimp_accuracy(scores)
    logger.info("BLiMP: %.1f%% over %d paradigms (%d pairs) in %.1f s", 100 * result.overall,
                len(result.paradigms), len(scores), time.perf_counter() - start)
    return result
