"""Reading fine-tuning data: tables (GLUE-style TSV/CSV), CoNLL token labels, SQuAD JSON.

Each reader raises naming the file, the line or question id, and what is wrong, before any
work is done; `LabelMap` turns the text labels into class ids. Strict, because a lenient
reader trains on the wrong data and exits 0: a column or JSON key given twice is refused, a
flag is parsed rather than truth-tested (`bool("False")` is True), only `\n` ends a line.
"""
from __future__ import annotations

import csv
import io
import json
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence, Union

from ..atomic import PathLike
from ..paths import check_readable
from .text import read_text


def _check_is_file(path: Path) -> None:
    """Refuse a path that is no file; a folder is named as one, with what it holds."""
    check_readable(path)  # a loop, a link to nothing, a file that may not be read: named
    if path.is_dir():
        files = sorted(p.name for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        held = (f"it holds {', '.join(files[:5])}{', ...' if len(files) > 5 else ''}"
                if files else "it holds no files")
        raise IsADirectoryError(f"{path} is a folder, not a file ({held}); name the file to read")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")


def _read_utf8(path: Path, expected: str, line_ends: bool = True) -> str:
    r"""The file's text (`text.read_text`, strict UTF-8); refused if missing or blank, or
    with `line_ends` if a \r stands alone (csv would split an example there, CoNLL drop a
    word's label)."""
    _check_is_file(path)
    text = read_text(path, line_ends=line_ends)
    if not text.strip():
        raise ValueError(f"{path} is empty; expected {expected}")
    found = re.search("\r(?!\n)", text) if line_ends else None
    if found:
        line = text.count("\n", 0, found.start()) + 1
        raise ValueError(f"{path}, line {line}: a carriage return (\\r) not followed by \\n; "
                         f"lines here end with \\n (or \\r\\n): convert the file's line "
                         f"endings, or remove the stray character")
    return text


# ---------------------------------------------------------------- tables and class labels
def read_table(path: PathLike, columns: Sequence[Union[str, int]], header: bool = True
               ) -> list[tuple[int, list[str]]]:
    """(line number, [value of each requested column]) for every data row of a TSV/CSV file:
    TSV without quoting (GLUE's convention), CSV as RFC 4180. An empty value is an error.

    `columns` are names in the header row, or, with `header=False` (a file of data rows only,
    as GLUE's CoLA), 0-based positions; every row then has the first row's width."""
    path = Path(path)
    _check_is_file(path)  # before its name's extension: a folder has none to tell
    kind = path.suffix.lower()
    if kind not in (".tsv", ".csv"):
        raise ValueError(f"{path}: cannot tell the format from the extension {path.suffix!r}; "
                         f"name the file .tsv (tab-separated) or .csv (comma-separated)")
    text = _read_utf8(path, "a header row naming the columns, then one example per row"
                      if header else "one example per row")
    lines = _tsv_rows(text) if kind == ".tsv" else _csv_rows(text, path)
    if header:
        head = [h.strip() for h in lines[0][1]]
        where, width, lines = _columns(head, list(columns), path), len(head), lines[1:]
        names = [str(c) for c in columns]
    else:
        width = len(next(fields for _, fields in lines if fields))  # the first data row's
        for c in columns:
            if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < width:
                raise ValueError(f"{path}: column {c!r} is not a position in its rows of "
                                 f"{width} fields (0 to {width - 1})")
        where, names = list(columns), [f"column {c + 1}" for c in columns]
    rows = []
    for start, fields in lines:
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue  # a blank line, or one of spaces only
        if len(fields) != width:
            hint = "a tab inside a text?" if kind == ".tsv" else "quote a text that holds commas"
            what = f"the header has {width}" if header else f"the first row has {width}"
            raise ValueError(f"{path}, line {start}: {len(fields)} field(s) but {what} "
                             f"({hint})")
        values = [fields[i].strip() for i in where]
        for name, value in zip(names, values):
            if not value:
                raise ValueError(f"{path}, line {start}: the {name!r} field is empty")
        rows.append((start, values))
    if not rows:
        raise ValueError(f"{path} has a header but no data rows")
    return rows


def _tsv_rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every line of a TSV text, blank lines as no fields (split
    by hand: csv would refuse a text longer than its field limit)."""
    lines = text.removesuffix("\n").split("\n")  # a last line end has no line after it
    return [(n, line.split("\t") if line else [])
            for n, line in enumerate((x.removesuffix("\r") for x in lines), start=1)]


_CSV_LIMIT = threading.Lock()


def _csv_rows(text: str, path: Path) -> list[tuple[int, list[str]]]:
    """(first line, fields) of every row of a CSV text, blank lines as no fields. The text
    is in memory whole, so csv's process-wide `field_size_limit` is raised to its length for
    this read and put back, under a lock (two reads must not restore each other's)."""
    with _CSV_LIMIT:
        limit = csv.field_size_limit()
        if len(text) > limit:
            csv.field_size_limit(len(text))
        try:
            reader = csv.reader(io.StringIO(text, newline=""), strict=True)
            rows, line = [], 1
            for fields in reader:  # a quoted field may span lines: a row starts after the last
                rows.append((line, fields))
                line = reader.line_num + 1
        except csv.Error as e:
            raise ValueError(f"{path}, line {reader.line_num}: unreadable row ({e})") from None
        finally:
            csv.field_size_limit(limit)
    return rows


def _columns(header: list[str], columns: list[str], path: Path) -> list[int]:
    """The index of each of `columns` in `header`, each there exactly once (a name given
    twice is refused when asked for: either column could be the one meant)."""
    if not header:  # csv reads a blank line as no fields at all
        raise ValueError(f"{path}, line 1: blank, but the first line must be the header "
                         f"naming the columns")
    at = {c: [i for i, h in enumerate(header) if h == c] for c in columns}
    missing = [c for c in columns if not at[c]]
    if missing:
        raise ValueError(f"{path}: no column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(map(repr, missing))} in the header (columns found: "
                         f"{', '.join(map(repr, header))})")
    for c in columns:
        if len(at[c]) > 1:
            numbers = [str(i + 1) for i in at[c]]
            times = "twice" if len(numbers) == 2 else f"{len(numbers)} times"
            raise ValueError(f"{path}: the header names {c!r} {times} (columns "
                             f"{', '.join(numbers[:-1])} and {numbers[-1]}, counting from 1); "
                             f"rename one so that the file says which to read")
    return [at[c][0] for c in columns]


def _is_number(x: str) -> bool:
    """Whether `x` is written as a decimal number (1, -0.5, 2.5e3), in ASCII."""
    return re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", x) is not None


def _is_int(x: str) -> bool:
    """Whether `x` is a sign and ASCII digits (not `int(x)`, which reads "1_0" as 10)."""
    return re.fullmatch(r"[+-]?[0-9]+", x) is not None


class LabelMap:
    """Class names read from a training file (`from_labels`), and the id of each: sorted by
    value when every label is an integer ("2" before "10", "07" and "7" one class), else as
    text. `names` is what a model's `id2label` should hold."""

    def __init__(self, names: Iterable[str], integers: bool = False,
                 source: PathLike = "the training data") -> None:
        self.names, self.integers, self.source = list(names), integers, source
        self._ids = {n: i for i, n in enumerate(self.names)}

    @classmethod
    def from_labels(cls, labels: Iterable[str], path: PathLike, unit: str = "row"
                    ) -> "LabelMap":
        """The classes of `labels` (read from `path`; `unit`: a row, a word), at least two."""
        labels = list(labels)
        integers = bool(labels) and all(_is_int(x) for x in labels)
        if labels and all(_is_number(x) for x in labels) and \
                any(not float(x).is_integer() for x in labels):
            # Scores such as STS-B's 0.0 - 5.0 would become one class per distinct value.
            values = sorted(set(labels), key=float)
            shown = ", ".join(values[:5]) + (", ..." if len(values) > 5 else "")
            raise ValueError(f"{path}: every label is a number and some are fractions "
                             f"({shown}): scores for regression, not class names; the scripts "
                             f"train classifiers (regression is BertForSequenceClassification "
                             f"with num_labels=1, trained on float labels)")
        names = sorted({cls._canonical(x, integers) for x in labels}, key=int if integers else str)
        if len(names) < 2:
            what = f"every {unit} has the label {names[0]!r}" if names else "there are no labels"
            raise ValueError(f"{path}: {what}; classification needs at least two classes")
        return cls(names, integers, path)

    @staticmethod
    def _canonical(label: str, integers: bool) -> str:
        return str(int(label)) if integers and _is_int(label) else label

    def id(self, label: str, path: PathLike, line: int) -> int:
        """The class id of `label`, read from `path` at `line`; an unknown one is an
        error naming both files."""
        i = self._ids.get(self._canonical(label, self.integers))
        if i is None:
            shown = ", ".join(map(repr, self.names[:10])) + (", ..." if len(self) > 10 else "")
            raise ValueError(f"{path}, line {line}: label {label!r} does not occur in "
                             f"{self.source} (its labels: {shown})")
        return i

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"LabelMap({self.names!r})"


# ---------------------------------------------------------------- CoNLL
_SPACE = " \t\r\f\v"  # ASCII whitespace within a line


class Sentence(NamedTuple):
    words: list[str]
    labels: list[str]  # one per word
    line: int  # the line of its first word (1-based); word i is on line + i


def read_conll(path: PathLike) -> list[Sentence]:
    """Sentences of a CoNLL-style file: one word per line, a blank line between sentences. A line is
    split at tabs if it holds one, else at ASCII whitespace (`str.split()` would cut
    "New\u00a0York"); the word is the first column and the label the last, so `EU NNP B-NP B-ORG`
    and `EU<TAB>B-ORG` read alike. `-DOCSTART-` lines end a sentence."""
    path = Path(path)
    text = _read_utf8(path, "one 'word label' per line, a blank line between sentences")
    sentences: list[Sentence] = []
    words, labels, first = [], [], 0
    for n, line in enumerate(text.split("\n") + [""], start=1):  # "": ends the last one
        line = line.removesuffix("\r")
        fields = [f.strip(_SPACE) for f in line.split("\t")] if "\t" in line else \
            [f for f in re.split(f"[{_SPACE}]+", line) if f]
        if not any(fields) or fields[0] == "-DOCSTART-":
            if words:
                sentences.append(Sentence(words, labels, first))
            words, labels = [], []
            continue
        if len(fields) < 2:
            raise ValueError(f"{path}, line {n}: one column ({fields[0]!r}) but a word needs "
                             f"its label in the last column, after whitespace or a tab")
        if not fields[0] or not fields[-1]:
            raise ValueError(f"{path}, line {n}: the {'word' if not fields[0] else 'label'} "
                             f"is empty")
        if not words:
            first = n
        words.append(fields[0])
        labels.append(fields[-1])
    if not sentences:
        raise ValueError(f"{path} holds no sentences, only -DOCSTART- lines")
    return sentences


# ---------------------------------------------------------------- SQuAD
class QAExample(NamedTuple):
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]]  # (text, its first character in the context); [] if none
    is_impossible: bool  # SQuAD 2.0: the context does not answer the question


def read_squad(path: PathLike, version_2: bool = False) -> list[QAExample]:
    """The questions of a SQuAD v1.1 or v2.0 JSON file, in file order: every answer's text
    at its `answer_start`; in v2.0, `is_impossible` questions (a JSON boolean, or
    "true"/"false") have none. A key the reader uses may not come twice."""
    path = Path(path)
    # JSON: a \r alone is whitespace between tokens like any other, no line end to refuse.
    text = _read_utf8(path, "SQuAD JSON: {\"data\": [{\"paragraphs\": [...]}]}", line_ends=False)
    try:
        doc = json.loads(text, object_pairs_hook=_Object.from_pairs)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {e.lineno}: not JSON ({e.msg})") from None
    if not isinstance(doc, dict) or not isinstance(_get(doc, "data", path, "the top level"), list):
        raise ValueError(f"{path}: no 'data' list at the top level; expected SQuAD JSON "
                         f"(v1.1 or v2.0)")
    examples: list[QAExample] = []
    seen: set[str] = set()
    for a, article in enumerate(doc["data"]):
        for p, para in enumerate(_field(article, "paragraphs", list, path, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _field(para, "context", str, path, where)
            for q, qa in enumerate(_field(para, "qas", list, path, where)):
                qid = str(_field(qa, "id", (str, int), path, f"{where}.qas[{q}]"))
                if qid in seen:
                    raise ValueError(f"{path}: question {qid!r} appears twice; ids must be unique")
                seen.add(qid)
                examples.append(_question(qa, qid, context, version_2, path))
    if not examples:
        raise ValueError(f"{path} holds no questions")
    return examples


def _question(qa: dict, qid: str, context: str, version_2: bool, path: Path) -> QAExample:
    """One question of a paragraph, its flag and answers checked."""
    where = f"question {qid!r}"
    question = _field(qa, "question", str, path, where)
    if not question.strip():
        raise ValueError(f"{path}: {where} has an empty question")
    impossible = _impossible(qa, path, where)
    if impossible and not version_2:
        raise ValueError(f"{path}: {where} is marked is_impossible "
                         f"({_json(qa['is_impossible'])}), a SQuAD 2.0 question; read the "
                         f"file with version_2=True")
    if impossible:
        # Answers beside a true flag mean one of the two is wrong (a "False" read by
        # truthiness looked just like this): refuse rather than drop the answers.
        answers = _get(qa, "answers", path, where) if "answers" in qa else []
        if answers != []:
            held = (f"{len(answers)} answer{'s' if len(answers) != 1 else ''}"
                    if isinstance(answers, list) else f"answers {_json(answers)}")
            raise ValueError(f"{path}: {where} is marked is_impossible "
                             f"({_json(qa['is_impossible'])}) but has {held}; an unanswerable "
                             f"question's answers must be [] (SQuAD 2.0 keeps its guesses in "
                             f"plausible_answers)")
        return QAExample(qid, question, context, [], True)
    answers = [_answer(ans, context, path, where)
               for ans in _field(qa, "answers", list, path, where)]
    if not answers:
        raise ValueError(f"{path}: {where} has no answers" + (
            "; mark it is_impossible if the context does not answer it" if version_2 else ""))
    return QAExample(qid, question, context, answers, False)


def _impossible(qa: dict, path: Path, where: str) -> bool:
    """`qa`'s is_impossible flag, False when it has none; parsed, never `bool(value)`."""
    if "is_impossible" not in qa:
        return False
    value = _get(qa, "is_impossible", path, where)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{path}: {where} has is_impossible {_json(value)}; write true or false "
                     f"(a JSON boolean, or the text \"true\" or \"false\")")


class _Object(dict):
    """A JSON object that remembers the keys it was given more than once, and how often
    (`json.loads` keeps the last silently; `_get` refuses them)."""
    repeated: dict[str, int]

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, object]]) -> "_Object":
        obj = cls(pairs)
        counts = Counter(key for key, _ in pairs) if len(obj) < len(pairs) else {}
        obj.repeated = {k: n for k, n in counts.items() if n > 1}
        return obj


def _get(obj: dict, key: str, path: Path, where: str):
    """`obj[key]` (None if absent); an error if the file gave `key` more than once."""
    n = getattr(obj, "repeated", {}).get(key)
    if n is not None:
        raise ValueError(f"{path}: {where} holds {key!r} {'twice' if n == 2 else f'{n} times'}; "
                         f"JSON keeps only the last, so delete the one that is wrong")
    return obj.get(key)


def _json(value) -> str:
    """`value` as the file spells it (true, null, "text"), cut short if long."""
    shown = json.dumps(value, ensure_ascii=False)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _field(obj, key: str, kind, path: Path, where: str):
    """`obj[key]`, there once and of `kind` (not a bool: `"answer_start": true` is no 1)."""
    value = _get(obj, key, path, where) if isinstance(obj, dict) else None
    if isinstance(value, bool) or not isinstance(value, kind):
        there = isinstance(obj, dict) and key in obj
        raise ValueError(f"{path}: {where} has no {key!r} "
                         + (f"of the right type (got {value!r})" if there else "field"))
    return value


def _answer(ans, context: str, path: Path, where: str) -> tuple[str, int]:
    text = _field(ans, "text", str, path, where + "'s answer")
    start = _field(ans, "answer_start", int, path, where + "'s answer")
    if not text.strip():
        raise ValueError(f"{path}: {where} has an empty answer text")
    found = context[start:start + len(text)] if start >= 0 else ""
    if found != text:
        raise ValueError(f"{path}: {where}: the answer {text!r} is not at its answer_start "
                         f"{start} in the context (found {found!r} there)")
    return text, start
