"""GLUE (Wang et al. 2019): its nine tasks as files are laid out, and scored as it scores them.

    found, missing = find_glue_tasks("glue_data")         # the tasks whose folder is there
    data = read_glue_task(found[0], "glue_data")          # train and evaluation splits, checked
    features = data.train.encode(tok, seq_len=128)        # [CLS] text [SEP] (pair [SEP])
    scores = glue_task_scores(found[0], {"dev": (gold, predictions)})
    average = glue_average({"CoLA": scores["score"], ...})

The layout is that of GLUE's `download_glue_data.py`: a folder per task (`CoLA`, `SST-2`,
`MRPC`, `STS-B`, `QQP`, `MNLI`, `QNLI`, `RTE`, `WNLI`), each with `train.tsv` and its dev
file(s), tab-separated without quoting. CoLA's files have no header (source, label, the
original mark, sentence); the others name their columns in a header. MNLI has two dev files,
`dev_matched.tsv` and `dev_mismatched.tsv`. The test files carry no labels and are not read.

Each task's metric is the benchmark's: CoLA the Matthews correlation, STS-B Pearson and
Spearman correlations of a regression (a head with `num_labels=1`), MRPC and QQP F1 of the
positive class and accuracy, the others accuracy. The task's score is the mean of its metrics
(MNLI: of matched and mismatched accuracy), and the GLUE score the mean over the tasks, WNLI
included: GLUE's rule, which gives BERT-large's published 80.5 from its task scores. Every
number is in percent, as GLUE reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from ..atomic import PathLike
from ..data.task_files import LabelMap, read_table
from ..data.tasks import SequenceSplit, random_subset
from ..paths import check_readable
from .metrics import accuracy, binary_f1, matthews_corrcoef, pearson, spearman

Column = Union[str, int]  # a header's name, or a 0-based position in a headerless file


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its files are, which columns hold the texts and the label, its
    classes (None: a regression on float scores) and the metrics its score averages."""

    name: str  # the folder's name, as download_glue_data.py writes it
    text: Column
    pair: Optional[Column]  # the second text of a sentence-pair task
    label: Column
    labels: Optional[tuple[str, ...]]  # the classes in id order; None: regression
    metrics: tuple[str, ...]  # keys of METRICS, averaged into the task's score
    evals: dict[str, str] = field(default_factory=lambda: {"dev": "dev.tsv"})
    train: str = "train.tsv"
    header: bool = True

    @property
    def num_labels(self) -> int:
        """The classifier's outputs: 1 for a regression."""
        return len(self.labels) if self.labels else 1


# The benchmark's nine tasks, in its order. Label names are as the files write them, so
# that a class id means the same thing in every run.
GLUE_TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("CoLA", text=3, pair=None, label=1, labels=("0", "1"), metrics=("matthews",),
             header=False),
    GlueTask("SST-2", "sentence", None, "label", ("0", "1"), ("accuracy",)),
    GlueTask("MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), ("f1", "accuracy")),
    GlueTask("STS-B", "sentence1", "sentence2", "score", None, ("pearson", "spearman")),
    GlueTask("QQP", "question1", "question2", "is_duplicate", ("0", "1"), ("f1", "accuracy")),
    GlueTask("MNLI", "sentence1", "sentence2", "gold_label",
             ("contradiction", "entailment", "neutral"), ("accuracy",),
             evals={"matched": "dev_matched.tsv", "mismatched": "dev_mismatched.tsv"}),
    GlueTask("QNLI", "question", "sentence", "label", ("entailment", "not_entailment"),
             ("accuracy",)),
    GlueTask("RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment"),
             ("accuracy",)),
    GlueTask("WNLI", "sentence1", "sentence2", "label", ("0", "1"), ("accuracy",)),
)}

# Each metric from gold and predicted values (class ids, or scores for STS-B), as a fraction.
METRICS = {"accuracy": accuracy, "f1": binary_f1, "matthews": matthews_corrcoef,
           "pearson": pearson, "spearman": spearman}


def _key(name: str) -> str:
    """A folder name as compared with a task's: `sst-2`, `SST2` and `sst_2` are SST-2."""
    return name.lower().replace("-", "").replace("_", "")


def find_glue_tasks(glue_dir: PathLike, names: Optional[Sequence[str]] = None
                    ) -> tuple[list[GlueTask], list[str]]:
    """(the tasks whose folder `glue_dir` holds, in GLUE's order; the names of those it does
    not). `names` limits the search to those tasks (any case). A folder matches a task by its
    name in any case, with or without the hyphen. Raises where `glue_dir` is no folder, is one
    task's own folder, or holds none of the tasks."""
    root = Path(glue_dir).expanduser()
    check_readable(root, expected="a folder of GLUE task folders")
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is a file; pass the folder that holds the GLUE "
                                 f"task folders (CoLA/, SST-2/, ...)")
    wanted = list(GLUE_TASKS.values())
    if names is not None:
        by_key = {_key(t): t for t in GLUE_TASKS}
        unknown = [n for n in names if _key(n) not in by_key]
        if unknown:
            raise ValueError(f"unknown GLUE task(s) {', '.join(map(repr, unknown))}; the "
                             f"tasks are {', '.join(GLUE_TASKS)}")
        chosen = {by_key[_key(n)] for n in names}
        wanted = [t for t in wanted if t.name in chosen]
    if _key(root.name) in {_key(t) for t in GLUE_TASKS} and (root / "train.tsv").exists():
        raise ValueError(f"{root} is the folder of one task; pass the folder above it, which "
                         f"holds the task folders ({root.parent})")
    folders = {_key(d.name): d for d in sorted(root.iterdir()) if d.is_dir()}
    found = [t for t in wanted if _key(t.name) in folders]
    if not found:
        raise FileNotFoundError(f"no GLUE task folder in {root}: looked for "
                                f"{', '.join(t.name + '/' for t in wanted)} (the layout of "
                                f"GLUE's download_glue_data.py)")
    return found, [t.name for t in wanted if t not in found]


def task_folder(task: GlueTask, glue_dir: PathLike) -> Path:
    """The folder of `task` in `glue_dir`, matched as `find_glue_tasks` matches it."""
    root = Path(glue_dir).expanduser()
    for d in sorted(root.iterdir()):
        if d.is_dir() and _key(d.name) == _key(task.name):
            return d
    raise FileNotFoundError(f"no {task.name}/ folder in {root}")


@dataclass
class GlueData:
    """A GLUE task read from its folder: the training split and each evaluation split
    (`dev`, or MNLI's `matched` and `mismatched`). Labels are class ids into `task.labels`,
    or float scores for a regression."""

    task: GlueTask
    train: SequenceSplit
    evals: dict[str, SequenceSplit]


def read_glue_task(task: GlueTask, glue_dir: PathLike, max_train: Optional[int] = None,
                   seed: int = 0) -> GlueData:
    """Read and check `task`'s training and dev files in `glue_dir` (`read_table`'s rules: a
    row of the wrong width, an empty text or label, a label outside the task's classes or a
    score that is no number each raise, naming the file and line). `max_train`: a random
    subset of the training rows, fixed by `seed` (`data.tasks.random_subset`)."""
    folder = task_folder(task, glue_dir)
    columns = [task.text] + ([task.pair] if task.pair is not None else []) + [task.label]
    classes = None if task.labels is None else LabelMap(
        task.labels, integers=all(x.isdigit() for x in task.labels),
        source=f"GLUE's {task.name} classes")

    def split(name: str, sample: Optional[int]) -> SequenceSplit:
        path = folder / name
        rows = random_subset(read_table(path, columns, header=task.header), sample, seed)
        labels: list = []
        for line, values in rows:
            if classes is not None:
                labels.append(classes.id(values[-1], path, line))
            else:
                labels.append(_score(values[-1], path, line))
        return SequenceSplit(texts=[v[0] for _, v in rows],
                             pairs=[v[1] for _, v in rows] if task.pair is not None else None,
                             labels=labels, lines=[line for line, _ in rows])

    return GlueData(task, split(task.train, max_train),
                    {name: split(file, None) for name, file in task.evals.items()})


def _score(text: str, path: Path, line: int) -> float:
    """A regression target read from `path` at `line`: a finite number."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not np.isfinite(value):
        raise ValueError(f"{path}, line {line}: the score {text!r} is not a finite number")
    return value


def glue_task_scores(task: GlueTask, results: dict[str, tuple[Sequence, Sequence]]) -> dict:
    """`task`'s metrics, in percent, from `results`: per evaluation split, (gold, predicted),
    class ids or (STS-B) scores. Keys: each metric (`matthews`, `f1`, `accuracy`,
    `pearson`, `spearman`), prefixed with its split where the task has two (MNLI's
    `matched_accuracy`), and `score`, their mean: the number GLUE averages."""
    if set(results) != set(task.evals):
        raise ValueError(f"{task.name} is scored on {', '.join(task.evals)}; got "
                         f"{', '.join(results) or 'nothing'}")
    scores: dict[str, float] = {}
    for split, (gold, predicted) in results.items():
        prefix = f"{split}_" if len(task.evals) > 1 else ""
        for metric in task.metrics:
            scores[prefix + metric] = 100.0 * METRICS[metric](gold, predicted)
    scores["score"] = float(np.mean(list(scores.values())))
    return scores


def glue_average(task_scores: dict[str, float]) -> float:
    """The GLUE score of the tasks in `task_scores` (name -> score, in percent): their plain
    mean, each task counting once (MNLI too), as the benchmark averages its nine."""
    unknown = [t for t in task_scores if t not in GLUE_TASKS]
    if unknown or not task_scores:
        raise ValueError(f"expected scores of GLUE tasks ({', '.join(GLUE_TASKS)}); got "
                         f"{', '.join(map(repr, task_scores)) or 'none'}")
    return float(np.mean(list(task_scores.values())))
