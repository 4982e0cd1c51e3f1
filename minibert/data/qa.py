"""Extractive question answering (SQuAD): windows over long contexts, answers back in characters.

BERT's recipe (Devlin et al. 2019, section 4.2, and google-research/bert's run_squad.py),
described in docs/qa.md, "Windows over long contexts": `[CLS] question [SEP] context [SEP]`
windows over a long context, trained on the answer's first and last token where a window
holds it whole and on `[CLS]` ("no answer here") elsewhere; `best_span` takes the best span
over a question's windows back to characters of the context, with SQuAD 2.0's null answer.
"""
from __future__ import annotations

import unicodedata
from collections import defaultdict
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from .task_files import QAExample
from .tokenizer import overflow_windows

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


class SpanPrediction(NamedTuple):
    id: str  # the question's
    text: str  # the answer, a substring of the context; "" when judged unanswerable
    start: int  # the answer is context[start:end]; -1 and -1 when unanswerable
    end: int
    score: float  # start + end logit of the answer's span (of [CLS] when unanswerable)
    null_score_diff: float  # the [CLS] score (lowest over windows) minus the best span's


def encode_qa(tok: "Tokenizer", examples: Sequence[QAExample], max_len: int = 384,
              doc_stride: int = 128, max_question_len: int = 64) -> list[dict]:
    """Features for extractive QA: one per window of each example's context; `doc_stride` is the
    context tokens consecutive windows share (transformers' `stride`). Each feature holds
    `input_ids`, `token_type_ids`, `start_position` and `end_position` (0, the `[CLS]`, where the
    window lacks the whole first answer), and for `best_span` `example`, `offsets` ((T, 2) int64,
    characters in the context), `is_context` and `max_context` ((T,) bool: more context around the
    token here than in any other window)."""
    if not isinstance(doc_stride, int) or doc_stride < 0:
        raise ValueError(f"doc_stride={doc_stride!r} must be an int >= 0")
    if not isinstance(max_question_len, int) or max_question_len < 1:
        raise ValueError(f"max_question_len={max_question_len!r} must be an int >= 1")
    features = []
    for x, ex in enumerate(examples):
        enc = tok.encode_pair(ex.question, ex.context)
        question = [i for i, s in zip(enc.input_ids, enc.sequence_ids) if s == 0][:max_question_len]
        ctx = [t for t, s in enumerate(enc.sequence_ids) if s == 1]
        ctx_ids = [enc.input_ids[t] for t in ctx]
        ctx_offsets = np.asarray([enc.offsets[t] for t in ctx], dtype=np.int64).reshape(-1, 2)
        room = max_len - len(question) - 3  # context tokens per window
        if room <= doc_stride:
            raise ValueError(
                f"question {ex.id!r}: max_len={max_len} leaves {room} context tokens per "
                f"window after its {len(question)} question tokens, which must exceed "
                f"doc_stride={doc_stride}; raise max_len or lower doc_stride/max_question_len")
        windows = overflow_windows(len(ctx), room, doc_stride)  # as the tokenizer's call
        best_window = _max_context_windows(windows, len(ctx))
        answer = _answer_tokens(ex, ctx_offsets)
        before = len(question) + 2  # [CLS] question [SEP]
        for w, (ws, we) in enumerate(windows):
            n = we - ws
            ids = [tok.cls_id, *question, tok.sep_id, *ctx_ids[ws:we], tok.sep_id]
            offsets = np.zeros((len(ids), 2), dtype=np.int64)  # (T, 2)
            offsets[before:before + n] = ctx_offsets[ws:we]
            is_context, max_context = np.zeros((2, len(ids)), dtype=bool)  # (T,) each
            is_context[before:before + n] = True
            max_context[before:before + n] = best_window[ws:we] == w
            start = end = 0
            if answer is not None and ws <= answer[0] and answer[1] < we:
                start, end = before + answer[0] - ws, before + answer[1] - ws
            features.append({
                "input_ids": np.asarray(ids, dtype=np.int64),
                "token_type_ids": np.asarray([0] * before + [1] * (n + 1), dtype=np.int64),
                "start_position": start, "end_position": end, "example": x,
                "offsets": offsets, "is_context": is_context, "max_context": max_context})
    return features


def _answer_tokens(ex: QAExample, offsets: np.ndarray) -> Optional[tuple[int, int]]:
    """First and last context token of the first answer: the tokens that overlap its
    characters (so spaces at the answer's edges do not matter)."""
    if ex.is_impossible or not ex.answers:
        return None
    text, start = ex.answers[0]
    end = start + len(text)
    inside = np.nonzero((offsets[:, 1] > start) & (offsets[:, 0] < end))[0]
    return (int(inside[0]), int(inside[-1])) if len(inside) else None


def _max_context_windows(windows: list[tuple[int, int]], n: int) -> np.ndarray:
    """(n,) for each context token, the window where it has the most context (BERT's
    `_check_is_max_context`: the fewer of the tokens to its left and right, plus a hundredth
    of the window's length; ties to the earlier window)."""
    best = np.full(n, -1, dtype=np.int64)
    best_score = np.full(n, -np.inf)
    for w, (ws, we) in enumerate(windows):
        i = np.arange(ws, we)
        score = np.minimum(i - ws, we - 1 - i) + 0.01 * (we - ws)
        better = score > best_score[ws:we]
        best[ws:we][better] = w
        best_score[ws:we][better] = score[better]
    return best


def best_span(start_logits: Sequence, end_logits: Sequence, features: Sequence[Mapping],
              examples: Sequence[QAExample], max_answer_length: int = 30, n_best: int = 20, *,
              version_2: bool = False, null_score_diff_threshold: float = 0.0
              ) -> list[SpanPrediction]:
    """The answer to each example, as characters of its context, from all its windows:
    `start_logits[f]` and `end_logits[f]` score `features[f]`'s tokens. Per window the `n_best` best
    context starts and ends are paired (end not before start, at most `max_answer_length` tokens,
    the start's max-context window); the best start + end logit wins. With `version_2` it is "" when
    the null score (the lowest `[CLS]` start + end) beats it by more than
    `null_score_diff_threshold`."""
    windows = defaultdict(list)
    for f, s, e in zip(features, start_logits, end_logits):
        T = len(f["input_ids"])
        windows[int(f["example"])].append((f, _as_array(s)[:T], _as_array(e)[:T]))
    predictions = []
    for x, ex in enumerate(examples):
        if x not in windows:
            raise ValueError(f"no feature for example {x} (question {ex.id!r})")
        null_score, best, best_score = np.inf, None, -np.inf
        for f, s, e in windows[x]:
            null_score = min(null_score, float(s[0] + e[0]))
            starts = _top(s, f["is_context"] & f["max_context"], n_best)
            ends = _top(e, f["is_context"], n_best)
            for i in starts:
                for j in ends:
                    if i <= j < i + max_answer_length and s[i] + e[j] > best_score:
                        best, best_score = (f, i, j), float(s[i] + e[j])
        diff = null_score - best_score
        if best is None or (version_2 and diff > null_score_diff_threshold):
            predictions.append(SpanPrediction(ex.id, "", -1, -1, null_score, diff))
            continue
        f, i, j = best
        start, end = int(f["offsets"][i][0]), int(f["offsets"][j][1])
        # A nonspacing mark (Mn: a decomposed accent) belongs to the letter before it, but a
        # tokenizer that strips accents ends that letter's token before the mark.
        while end < len(ex.context) and unicodedata.category(ex.context[end]) == "Mn":
            end += 1
        predictions.append(SpanPrediction(ex.id, ex.context[start:end], start, end,
                                          best_score, diff))
    return predictions


def _as_array(logits) -> np.ndarray:
    """(T,) float64 from a numpy array, a list or a torch tensor of any float dtype."""
    if hasattr(logits, "detach"):  # torch: bf16 has no numpy dtype
        logits = logits.detach().float().cpu().numpy()
    return np.asarray(logits, dtype=np.float64).reshape(-1)


def _top(scores: np.ndarray, allowed: np.ndarray, n: int) -> list[int]:
    """The `n` positions with the highest scores among the allowed ones."""
    candidates = np.nonzero(allowed)[0]
    return candidates[np.argsort(-scores[candidates], kind="stable")[:n]].tolist()
