"""Fine-tuning tasks: from read examples to encoded features to padded batches.

The BERT paper's three downstream tasks (Devlin et al. 2019, section 4) share one path: a
reader (`task_files`) gives examples, an encoder turns each into *features* (dicts of ids,
targets and what maps predictions back), `TaskCollator` pads them: `encode_classification`
(GLUE), `encode_token_classification` (CoNLL NER), `encode_qa` (SQuAD, in `qa`). A task
read from a training and an evaluation file (`TaskData`):

    task = read_table_task("train.tsv", "dev.tsv", text="sentence", pair=None, label="label")
    features = task.train.encode(tok, seq_len=128)  # task.names: the classes, in id order
    batch = TaskCollator(tok.pad_id)(features[:32])  # input_ids, ..., labels
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, TypeVar, Union

import numpy as np
import torch

from ..atomic import PathLike
from ..tasks.metrics import spans
from .mlm import IGNORE_INDEX, check_pad_multiple, pad_batch
from .qa import SpanPrediction, best_span, encode_qa
from .task_files import LabelMap, QAExample, Sentence, read_conll, read_squad, read_table

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = ["LabelMap", "QAExample", "Sentence", "SequenceSplit", "SpanPrediction", "TaskCollator",
           "TaskData", "TokenSplit", "best_span", "encode_classification", "encode_qa",
           "encode_token_classification", "random_subset", "read_conll", "read_conll_task",
           "read_squad", "read_table", "read_table_task", "word_predictions"]

T = TypeVar("T")


def _check_max_len(max_len: int, least: int) -> None:
    if not isinstance(max_len, int) or max_len < least:
        raise ValueError(f"max_len={max_len!r} must be an int of at least {least}: the special "
                         f"tokens and one token of text")


# ---------------------------------------------------------------- sequence classification
def encode_classification(tok: "Tokenizer", texts: Sequence[str],
                          labels: Optional[Sequence[Any]] = None,
                          pairs: Optional[Sequence[str]] = None, max_len: int = 128) -> list[dict]:
    """One feature per text: `[CLS] text [SEP]`, or `[CLS] text [SEP] pair [SEP]`, cut to `max_len`
    (a pair's longer text first, `truncated_lengths`): `input_ids` and `token_type_ids` ((T,) int64)
    and, with `labels`, its `label` (a class id, or a float for regression)."""
    _check_max_len(max_len, 3 if pairs is None else 4)
    for name, other in (("labels", labels), ("pairs", pairs)):
        if other is not None and len(other) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(other)} {name}")
    features = []
    for i, text in enumerate(texts):
        enc = tok.encode_with_offsets(text, max_len) if pairs is None else \
            tok.encode_pair(text, pairs[i], max_len)
        feature = {"input_ids": np.asarray(enc.input_ids, dtype=np.int64),
                   "token_type_ids": np.asarray(enc.token_type_ids, dtype=np.int64)}
        if labels is not None:
            feature["label"] = labels[i]
        features.append(feature)
    return features


# ---------------------------------------------------------------- token classification
def encode_token_classification(tok: "Tokenizer", sentences: Sequence[Sequence[str]],
                                labels: Optional[Sequence[Sequence[int]]] = None,
                                max_len: int = 128) -> list[dict]:
    """Features for word-level labelling (NER, POS), at least one per sentence. A word's label goes
    on its *first* piece, the others get `IGNORE_INDEX` (the BERT paper's NER setup, section 5.3); a
    word that tokenizes to nothing is one `[UNK]`. A long sentence is cut into consecutive windows
    of whole words. Each feature holds `input_ids`, `token_type_ids`, `labels` and for
    `word_predictions` `sentence`, `n_words` and `word_ids` ((T,) int64, each token's word, -1 for
    `[CLS]`/`[SEP]`)."""
    _check_max_len(max_len, 3)
    if labels is not None and len(labels) != len(sentences):
        raise ValueError(f"{len(sentences)} sentences but {len(labels)} label lists")
    room = max_len - 2
    features = []
    for k, words in enumerate(sentences):
        if not words:
            raise ValueError(f"sentence {k} has no words")
        if labels is not None and len(labels[k]) != len(words):
            raise ValueError(f"sentence {k} has {len(words)} words but {len(labels[k])} labels")
        enc = tok.encode_words(list(words))
        pieces: list[list[int]] = [[] for _ in words]
        for i, w in zip(enc.input_ids, enc.word_ids):
            if w is not None:
                pieces[w].append(i)
        pieces = [p or [tok.unk_id] for p in pieces]
        start = 0
        while start < len(words):
            end, used = start, 0
            while end < len(words) and used + len(pieces[end]) <= room:
                used += len(pieces[end])
                end += 1
            end = max(end, start + 1)  # a word longer than a window: its first pieces
            features.append(_word_window(tok, pieces, start, end, room, k,
                                         labels[k] if labels is not None else None))
            start = end
    return features


def _word_window(tok, pieces, start, end, room, sentence, word_labels) -> dict:
    """`[CLS] pieces of words[start:end] [SEP]` as a feature."""
    ids, word_ids, labels = [tok.cls_id], [-1], [IGNORE_INDEX]
    for w in range(start, end):
        p = pieces[w][:room]
        ids += p
        word_ids += [w] * len(p)
        if word_labels is not None:
            labels += [word_labels[w]] + [IGNORE_INDEX] * (len(p) - 1)
    ids, word_ids, labels = ids + [tok.sep_id], word_ids + [-1], labels + [IGNORE_INDEX]
    feature = {"input_ids": np.asarray(ids, dtype=np.int64),
               "token_type_ids": np.zeros(len(ids), dtype=np.int64),
               "word_ids": np.asarray(word_ids, dtype=np.int64), "sentence": sentence,
               "n_words": len(pieces)}
    if word_labels is not None:
        feature["labels"] = np.asarray(labels, dtype=np.int64)
    return feature


def word_predictions(features: Sequence[Mapping], token_predictions: Sequence[Sequence[Any]]
                     ) -> list[list[Any]]:
    """Per sentence, per word: the prediction at the word's first piece. `token_predictions[f]`
    scores `features[f]`'s tokens; the features must be all their sentences', in any order."""
    out: dict[int, dict[int, Any]] = {}
    for f, pred in zip(features, token_predictions):
        words = out.setdefault(int(f["sentence"]), {})
        previous = -1
        for t, w in enumerate(f["word_ids"]):
            w = int(w)
            if w >= 0 and w != previous:  # the first piece of word w
                if w in words:
                    raise ValueError(f"word {w} of sentence {f['sentence']} is in two features")
                words[w] = pred[t].item() if hasattr(pred[t], "item") else pred[t]
            previous = w
    n_words = {int(f["sentence"]): int(f["n_words"]) for f in features}
    result = []
    for k in range(max(out) + 1 if out else 0):
        words = out.get(k, {})
        if k not in n_words or len(words) != n_words[k]:
            raise ValueError(f"sentence {k} is missing from the features, or some of its words")
        result.append([words[w] for w in range(n_words[k])])
    return result


# ---------------------------------------------------------------- batches
class TaskCollator:
    """Pad a list of task features into a batch of tensors (dynamic padding). Returns `(B, T)` int64
    `input_ids`, `attention_mask` and `token_type_ids` (unless `segments=False`:
    `model.config.has_segments`), plus the targets the features carry: `labels` `(B,)` (float32 for
    regression) or `(B, T)` (padded with `label_pad`), `start_positions`, `end_positions`, and
    `task` (one per batch). `epoch` is ignored."""

    def __init__(self, pad_id: int, label_pad: int = IGNORE_INDEX,
                 pad_to_multiple_of: Optional[int] = None, *, segments: bool = True) -> None:
        check_pad_multiple(pad_to_multiple_of)
        self.pad_id, self.label_pad = pad_id, label_pad
        self.pad_to_multiple_of, self.segments = pad_to_multiple_of, bool(segments)

    def __call__(self, examples: Sequence[Mapping], epoch: int = 0) -> dict[str, torch.Tensor]:
        multiple = self.pad_to_multiple_of
        ids, lengths = pad_batch([e["input_ids"] for e in examples], self.pad_id, multiple)
        mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]  # (B, T), True on tokens
        batch = {"input_ids": torch.from_numpy(ids),
                 "attention_mask": torch.from_numpy(mask.astype(np.int64))}
        if self.segments:
            types = np.zeros_like(ids)  # (B, T)
            for row, e in zip(types, examples):
                if "token_type_ids" in e:
                    row[:len(e["token_type_ids"])] = e["token_type_ids"]
            batch["token_type_ids"] = torch.from_numpy(types)
        for key in ("label", "labels", "start_position", "end_position", "task"):
            have = sum(key in e for e in examples)
            if have not in (0, len(examples)):
                raise ValueError(f"{have} of {len(examples)} examples have {key!r}; a batch "
                                 f"needs it in all or none")
        if "labels" in examples[0]:
            labels, _ = pad_batch([e["labels"] for e in examples], self.label_pad, multiple)
            batch["labels"] = torch.from_numpy(labels)  # (B, T)
        elif "label" in examples[0]:
            values = [e["label"] for e in examples]
            regression = any(isinstance(v, (float, np.floating)) for v in values)
            batch["labels"] = torch.tensor(values, dtype=torch.float32 if regression
                                           else torch.long)  # (B,)
        if "start_position" in examples[0]:  # start_positions, end_positions: (B,)
            for key in ("start_position", "end_position"):
                batch[key + "s"] = torch.tensor([e[key] for e in examples], dtype=torch.long)
        if "task" in examples[0]:
            tasks = sorted({e["task"] for e in examples})
            if len(tasks) != 1:
                raise ValueError(f"a batch must hold one task's examples, got {tasks}")
            batch["task"] = tasks[0]
        return batch


# ---------------------------------------------------------------- whole tasks
@dataclass
class SequenceSplit:
    """The rows of one file of a sequence-classification task, in the file's order."""
    texts: list[str]
    pairs: Optional[list[str]]  # the second text of each row, for sentence pairs
    labels: list[int]  # class ids, into TaskData.names
    lines: list[int]  # each row's line in its file, for messages and predictions

    def __len__(self) -> int:
        return len(self.labels)

    def tokenizer_texts(self) -> list[str]:
        """The texts a tokenizer would be trained on."""
        return self.texts + (self.pairs or [])

    def encode(self, tok: "Tokenizer", seq_len: int) -> list[dict]:
        """One feature per row (`encode_classification`), cut to `seq_len` tokens."""
        return encode_classification(tok, self.texts, self.labels, self.pairs, max_len=seq_len)


@dataclass
class TokenSplit:
    """The sentences of one file of a token-classification task, in the file's order."""
    sentences: list[Sentence]
    labels: list[list[int]]  # per sentence, per word: a tag id, into TaskData.names

    def __len__(self) -> int:
        return len(self.labels)

    def tokenizer_texts(self) -> list[str]:
        return [" ".join(s.words) for s in self.sentences]

    def encode(self, tok: "Tokenizer", seq_len: int) -> list[dict]:
        """Windows of whole words (`encode_token_classification`), `seq_len` pieces each."""
        return encode_token_classification(tok, [s.words for s in self.sentences],
                                           self.labels, seq_len)


@dataclass
class TaskData:
    """A labelled task read from a training and an evaluation file: `kind` "sequence" or
    "token", the training file's class names in id order, and the two splits as ids."""
    kind: str
    names: list[str]
    train: Union[SequenceSplit, TokenSplit]
    eval: Union[SequenceSplit, TokenSplit]


def random_subset(items: list[T], n: Optional[int], seed: int) -> list[T]:
    """`n` of the items, chosen by `seed`, in their order (all of them without `n`)."""
    if not n or n >= len(items):
        return items
    keep = np.random.default_rng(seed).choice(len(items), n, replace=False)
    return [items[i] for i in sorted(keep)]


def read_table_task(train_file: PathLike, eval_file: PathLike, text: str,
                    pair: Optional[str], label: str, max_train: Optional[int] = None,
                    seed: int = 0) -> TaskData:
    """A sequence-classification task from two TSV/CSV files (`read_table`): the columns
    `text`, `pair` (None for single texts) and `label`. The classes are the training file's;
    an evaluation label it lacks is an error naming the line. `max_train`: a random subset
    of the training rows, fixed by `seed`."""
    columns = [text] + ([pair] if pair else []) + [label]
    train_rows, eval_rows = read_table(train_file, columns), read_table(eval_file, columns)
    labels = LabelMap.from_labels([r[-1] for _, r in train_rows], train_file)

    def split(rows: list[tuple[int, list[str]]], path) -> SequenceSplit:
        return SequenceSplit(texts=[r[0] for _, r in rows],
                             pairs=[r[1] for _, r in rows] if pair else None,
                             labels=[labels.id(r[-1], path, line) for line, r in rows],
                             lines=[line for line, _ in rows])

    return TaskData("sequence", labels.names, train=split(random_subset(
        train_rows, max_train, seed), train_file), eval=split(eval_rows, eval_file))


def read_conll_task(train_file: PathLike, eval_file: PathLike, scheme: str,
                    max_train: Optional[int] = None, seed: int = 0) -> TaskData:
    """A token-classification task from two CoNLL files (`read_conll`). Every tag of both is
    checked against `scheme` ("IOB2", "BIO", "IO"; see `metrics.spans`) and named with its
    line when the scheme lacks it; the tags are the training file's. `max_train`: a random
    subset of the training sentences, fixed by `seed`."""
    train_s, eval_s = read_conll(train_file), read_conll(eval_file)
    for path, sentences in ((train_file, train_s), (eval_file, eval_s)):
        first: dict[str, int] = {}  # each tag, and the line it first appears on
        for s in sentences:
            for i, tag in enumerate(s.labels):
                first.setdefault(tag, s.line + i)
        for tag, line in first.items():
            try:
                spans([tag], scheme)  # a tag the scheme does not have raises
            except ValueError as e:
                raise ValueError(f"{path}, line {line}: {e}") from None
    labels = LabelMap.from_labels([t for s in train_s for t in s.labels], train_file, "word")

    def split(sents: list[Sentence], path) -> TokenSplit:
        return TokenSplit(sents, [[labels.id(t, path, s.line + i) for i, t in enumerate(s.labels)]
                                  for s in sents])

    return TaskData("token", labels.names, train=split(random_subset(train_s, max_train, seed),
                                                       train_file), eval=split(eval_s, eval_file))
