"""`minibert.train` called from a researcher's own code: a model of one's own (a regression
head around `BertModel`, with no `config` and no `logits`) trains, accumulates exactly, is
metered and resumes exactly, and what it must return and be given is said by name; and a
call shows its progress as a notebook user expects."""

import contextlib
import logging
import sys
from typing import NamedTuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minibert
from engine_utils import (FP32_RUNS_APART, collator, same_logged_losses, tiny_corpus,
                          sigterm_in_forward, tiny_model, train_config)
from engine_utils import quick_runs  # noqa: F401 (a fixture: one thread, for tiny models)
from facts import raises
from minibert.data import pad_batch
from minibert.training.runlog import read_rows

VOCAB = 64


class Scored(NamedTuple):
    loss: torch.Tensor  # the mean squared error over the batch's examples
    prediction: torch.Tensor  # (B,)


class Reg(nn.Module):
    """A regression head of one's own: minibert's encoder, a linear read-out of [CLS], MSE
    on float labels. It has neither `config` nor `logits`."""

    def __init__(self, seed: int = 0, dropout: float = 0.0, vocab_size: int = VOCAB):
        super().__init__()
        minibert.set_seed(seed)
        self.bert = minibert.BertModel(minibert.BertConfig.preset(
            "tiny", vocab_size=vocab_size, max_position_embeddings=64, hidden_dropout=dropout,
            attention_dropout=dropout))
        self.head = nn.Linear(self.bert.config.hidden_size, 1)

    def forward(self, input_ids, attention_mask, labels):
        hidden = self.bert(input_ids, attention_mask).last_hidden_state  # (B, T, H)
        prediction = self.head(hidden[:, 0]).squeeze(-1)  # (B,)
        return Scored(F.mse_loss(prediction, labels), prediction)


def made_up_examples(n: int = 37) -> list[dict]:
    """Sequences of 4 to 30 ids whose target is 1 + 2 x (the share of ids below 30)."""
    g = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(n):
        ids = torch.randint(5, VOCAB, (int(torch.randint(4, 30, (1,), generator=g)),),
                            generator=g)
        examples.append({"input_ids": [2] + ids.tolist() + [3],
                         "target": 1.0 + 2.0 * float((ids < 30).float().mean())})
    return examples


def collate(examples, epoch=0):
    ids, lengths = pad_batch([e["input_ids"] for e in examples], pad_id=0)
    ids = torch.from_numpy(ids)
    mask = (torch.arange(ids.shape[1])[None] < torch.from_numpy(lengths)[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask,
            "labels": torch.tensor([e["target"] for e in examples])}  # float32, (B,)


def reg_config(**overrides):
    return train_config(**{"batch_size": 8, "max_steps": 8, **overrides})


def _losses(out_dir):
    return [r["loss"] for r in read_rows(out_dir / "metrics.jsonl") if "loss" in r]


def _max_rel_diff(m1, m2):
    return max(((p - q).norm() / q.norm().clamp_min(1e-12)).item()
               for p, q in zip(m1.parameters(), m2.parameters()))


def test_train_and_its_config_are_at_the_top_level():
    import minibert.training.engine

    assert minibert.train is minibert.training.engine.train
    assert minibert.TrainConfig is minibert.training.engine.TrainConfig
    assert {"train", "TrainConfig"} <= set(minibert.__all__) and "train" in dir(minibert)


def test_a_regression_head_of_ones_own_trains_and_accumulates_exactly(tmp_path, monkeypatch):
    """37 examples at batch 8: each epoch ends on a batch of 5, whose micro-batches of 2
    hold 2, 2 and 1 examples. Weighted by their examples (a float label is one target each)
    they give what the whole batch gives."""
    import minibert.training.engine

    examples = made_up_examples()
    counted = []
    count = minibert.training.engine.count_targets
    monkeypatch.setattr(minibert.training.engine, "count_targets",
                        lambda batch: counted.append((count(batch), len(batch["labels"])))
                        or count(batch))
    full, accum = Reg(), Reg()
    minibert.train(full, examples, collate, reg_config(), tmp_path / "full")
    minibert.train(accum, examples, collate, reg_config(micro_batch_size=2), tmp_path / "accum")
    a, b = _losses(tmp_path / "full"), _losses(tmp_path / "accum")
    assert len(a) == 8 and a[-1] < a[0] / 2, a
    assert same_logged_losses(a, b)
    assert _max_rel_diff(full, accum) <= FP32_RUNS_APART
    assert all(n == examples_in for n, examples_in in counted)  # B targets, B examples
    assert {n for n, _ in counted} == {8, 5, 2, 1}


def test_a_float_label_is_a_target_whatever_its_value():
    """IGNORE_INDEX marks a class id that predicts nothing; a regression target of -100.0
    is a number like any other, and the MSE a head computes counts it."""
    from minibert.labels import count_targets

    ids = torch.ones(3, 5, dtype=torch.long)
    assert count_targets({"input_ids": ids, "labels": torch.tensor([0.5, -100.0, 2.0])}) == 3
    assert count_targets({"input_ids": ids, "labels": torch.tensor([1, -100, 0])}) == 2
    with raises(ValueError, "labels", "'input_ids'", "collate"):
        count_targets({"input_ids": ids})


def test_what_a_model_and_a_batch_must_hold_is_said_by_name(tmp_path):
    class NoLoss(Reg):
        def forward(self, input_ids, attention_mask, labels):
            return {"loss": super().forward(input_ids, attention_mask, labels).loss}

    examples = made_up_examples()
    with raises(TypeError, "NoLoss", "dict", ".loss"):
        minibert.train(NoLoss(), examples, collate, reg_config(max_steps=1, warmup=0),
                       tmp_path / "a")

    def without_ids(batch, epoch=0):
        batch = collate(batch, epoch)
        return {"tokens": batch.pop("input_ids"), **batch}

    with raises(ValueError, "input_ids", "'tokens'", "collate"):
        minibert.train(Reg(), examples, without_ids, reg_config(max_steps=1, warmup=0),
                       tmp_path / "b")


def test_without_attention_mask_every_position_is_a_token(tmp_path):
    class Unmasked(Reg):
        def forward(self, input_ids, labels):
            return super().forward(input_ids, torch.ones_like(input_ids), labels)

    def unmasked(batch, epoch=0):
        batch = collate(batch, epoch)
        del batch["attention_mask"]
        return batch

    result = minibert.train(Unmasked(), made_up_examples(8), unmasked,
                            reg_config(max_steps=1, warmup=0), tmp_path)
    assert result["tokens_seen"] == unmasked(made_up_examples(8))["input_ids"].numel()


def test_a_micro_batch_with_nothing_to_predict_needs_no_logits(tmp_path, monkeypatch):
    """A classifier of one's own that returns a loss and no logits, the second micro-batch
    of each step all IGNORE_INDEX (its mean loss NaN): each step is the whole batch's, in
    which those examples weigh nothing, and none is skipped."""
    import minibert.training.engine
    from minibert.data.sampler import GlobalBatches
    from minibert.labels import IGNORE_INDEX

    class Cls(Reg):
        def forward(self, input_ids, attention_mask, labels):
            hidden = self.bert(input_ids, attention_mask).last_hidden_state  # (B, T, H)
            scores = torch.cat([self.head(hidden[:, 0]), -self.head(hidden[:, 0])], -1)
            return Scored(F.cross_entropy(scores, labels, ignore_index=IGNORE_INDEX), scores)

    examples = made_up_examples(32)
    order = GlobalBatches(len(examples), 8, seed=0)  # the order train takes (its seed 0)
    for _ in range(4):
        for i in order.next()[1][4:]:
            examples[i]["ignored"] = True

    def classes(batch, epoch=0):
        labels = [IGNORE_INDEX if e.get("ignored") else int(e["target"] > 2) for e in batch]
        return {**collate(batch, epoch), "labels": torch.tensor(labels)}

    full, accum = Cls(), Cls()
    minibert.train(full, examples, classes, reg_config(max_steps=4), tmp_path / "full")
    counted, count = [], minibert.training.engine.count_targets
    monkeypatch.setattr(minibert.training.engine, "count_targets",
                        lambda batch: counted.append(count(batch)) or count(batch))
    result = minibert.train(accum, examples, classes, reg_config(max_steps=4, micro_batch_size=4),
                            tmp_path / "accum")
    assert counted[1::2] == [0, 0, 0, 0] and all(counted[::2])  # every second one: nothing
    assert result["skipped_steps"] == 0
    assert same_logged_losses(_losses(tmp_path / "full"), _losses(tmp_path / "accum"))
    assert _max_rel_diff(full, accum) <= FP32_RUNS_APART


def test_a_model_of_ones_own_is_metered_by_its_matmul_weights(tmp_path, caplog):
    """Without a config to read its shape from, a token costs 6 FLOPs per matmul weight
    (forward and backward): every weight matrix, the embedding tables (lookups) left out,
    as `meters.flops_per_token` leaves them out of minibert's own models. The log says once
    what that count leaves out."""
    model = Reg()
    weights = sum(p.numel() for name, p in model.named_parameters()
                  if p.ndim >= 2 and not name.startswith("bert.embeddings."))
    peak = 1e6  # low, so that the rounded mfu keeps its digits
    with caplog.at_level(logging.INFO, logger="minibert"):
        minibert.train(model, made_up_examples(), collate, reg_config(max_steps=3,
                                                                      peak_flops=peak), tmp_path)
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "mfu" in r]
    assert len(rows) == 3
    for row in rows:
        assert row["mfu"] * peak / row["tokens_per_s"] == pytest.approx(6 * weights, rel=1e-3)
    said = [m for m in caplog.messages if "Reg" in m and "attention" in m]
    assert len(said) == 1 and f"{weights:,}" in said[0], caplog.messages


def test_a_model_of_ones_own_resumes_exactly(tmp_path):
    """Interrupted at step 3 by SIGTERM and resumed into a model of another seed: the same
    losses and the same weights as the uninterrupted run (dropout on, so the saved random
    generators matter). A resume into a model of another shape is refused by name."""
    examples = made_up_examples()
    uninterrupted = Reg(dropout=0.1)
    minibert.train(uninterrupted, examples, collate, reg_config(), tmp_path / "ref")
    # during step 3: it finishes, is saved, and the run stops
    result = minibert.train(sigterm_in_forward(Reg(dropout=0.1), 3), examples, collate,
                            reg_config(), tmp_path / "run")
    assert result["interrupted"] and result["steps"] == 3
    resumed = Reg(seed=123, dropout=0.1)
    result = minibert.train(resumed, examples, collate, reg_config(), tmp_path / "run",
                            resume=True)
    assert result["steps"] == 8 and result["steps_this_run"] == 5
    assert _losses(tmp_path / "run") == _losses(tmp_path / "ref")
    assert all(torch.equal(p, q) for p, q in zip(resumed.parameters(),
                                                 uninterrupted.parameters()))
    from minibert.training.checkpoint import latest_checkpoint
    from minibert.interop.export import export_checkpoint

    with raises(ValueError, "'Reg'", "load_checkpoint"):  # minibert's classes only
        export_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"), tmp_path / "x")
    with raises(ValueError, "bert.embeddings.word.weight", "[64, 128]", "[72, 128]") as info:
        minibert.train(Reg(vocab_size=72), examples, collate, reg_config(max_steps=9),
                       tmp_path / "run", resume=True)
    assert [name for name, _, _ in info.value.diffs] == ["model shapes "
                                                         "bert.embeddings.word.weight"]


class InBatch(Reg):
    """A loss over the batch as a whole: each example's [CLS] vector scored against every
    other example's, the right one its own (in-batch negatives, as a two-tower retriever
    trains). A half batch holds half the negatives: another loss, not a part of this one."""

    batch_level_loss = True

    def forward(self, input_ids, attention_mask, labels):
        cls = self.bert(input_ids, attention_mask).last_hidden_state[:, 0]  # (B, H)
        scores = cls @ cls.T  # (B, B)
        return Scored(F.cross_entropy(scores, torch.arange(len(scores))), scores.diagonal())


def test_a_batch_level_loss_is_refused_micro_batches_before_anything_is_written(tmp_path):
    """Declared by `batch_level_loss = True`, a loss that does not accumulate exactly is
    refused micro-batches smaller than the batch (by micro_batch_size, by processes, or by
    out-of-memory back-off), naming the setting, with the run folder as it was; whole
    batches train."""
    from minibert.training.distributed import DistContext

    examples, run = made_up_examples(16), tmp_path / "run"
    result = minibert.train(InBatch(), examples, collate, reg_config(max_steps=1, warmup=0),
                            run)
    assert result["steps"] == 1
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for overrides, call, facts in [
            (dict(micro_batch_size=2), dict(overwrite=True),
             ["InBatch", "batch_level_loss", "micro_batch_size=2", "batch_size=8"]),
            (dict(micro_batch_size=4, max_steps=2), dict(resume=True),
             ["micro_batch_size=4", "batch_size=8"]),
            (dict(auto_micro_batch=True), dict(overwrite=True), ["auto_micro_batch"]),
            ({}, dict(overwrite=True, ctx=DistContext(world_size=2)),
             ["2 processes", "4 examples", "batch_size=8"])]:
        with raises(ValueError, *facts):
            minibert.train(InBatch(), examples, collate,
                           reg_config(**{"max_steps": 1, "warmup": 0, **overrides}), run, **call)
        assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*")
                if p.is_file()} == before, overrides

    class Unclear(InBatch):
        batch_level_loss = "yes"

    with raises(TypeError, "Unclear", "batch_level_loss='yes'", "True or False"):
        minibert.train(Unclear(), examples, collate, reg_config(max_steps=1), tmp_path / "b")
    assert not (tmp_path / "b").exists()


# ---- progress, as a notebook shows it ---------------------------------------------------------

@contextlib.contextmanager
def as_in_a_notebook():
    """Logging as a fresh notebook has it: no handler anywhere. pytest's own, which catch
    records for its reports, are taken off the root logger meanwhile (inside the test's
    body, since pytest adds one as the test starts) and put back after."""
    root = logging.getLogger()
    kept = root.handlers[:]
    for handler in kept:
        root.removeHandler(handler)
    try:
        assert not logging.getLogger("minibert").hasHandlers()
        yield
    finally:
        for handler in kept:
            root.addHandler(handler)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _without_tqdm(monkeypatch):
    for name in ("tqdm", "tqdm.auto", "tqdm.std"):
        monkeypatch.setitem(sys.modules, name, None)  # `import tqdm` raises ImportError


def _rows_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("step ") and "loss" in line]


def test_without_tqdm_a_call_logs_a_line_every_log_every_steps(corpus, tmp_path, monkeypatch,
                                                                capfd):
    tok, ds = corpus
    _without_tqdm(monkeypatch)
    with as_in_a_notebook():
        minibert.train(tiny_model(tok), ds, collator(tok),
                       train_config(max_steps=6, log_every=2, progress=True), tmp_path)
        package = logging.getLogger("minibert")  # as it was before the call
        assert package.handlers == [] and package.level == logging.NOTSET
    out, err = capfd.readouterr()
    assert [line.split(" |")[0] for line in _rows_in(err)] == ["step 2", "step 4", "step 6"]
    assert out == ""


def test_logging_set_up_by_the_caller_is_left_as_it_is(corpus, tmp_path, monkeypatch, capfd):
    """A handler of the caller's, as `logging.basicConfig(level=logging.INFO)` sets up: the
    rows reach it once, and train adds no handler of its own."""
    import io

    tok, ds = corpus
    _without_tqdm(monkeypatch)
    mine, root = io.StringIO(), logging.getLogger()
    with as_in_a_notebook():
        handler, level = logging.StreamHandler(mine), root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            minibert.train(tiny_model(tok), ds, collator(tok),
                           train_config(max_steps=4, log_every=2, progress=True), tmp_path)
            assert logging.getLogger("minibert").handlers == []
        finally:
            root.removeHandler(handler)
            root.setLevel(level)
    assert len(_rows_in(mine.getvalue())) == 2
    assert capfd.readouterr() == ("", "")


def test_progress_false_drops_the_bar_alone(corpus, tmp_path, monkeypatch, capfd):
    """progress=False (--no-progress): no bar, on a terminal or not, and the rows still
    logged, a line each, with tqdm or without."""
    tok, ds = corpus
    cfg = train_config(max_steps=4, log_every=2, progress=False)
    with as_in_a_notebook():
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # where a bar would draw
        minibert.train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "tqdm")
        _without_tqdm(monkeypatch)
        minibert.train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "no-tqdm")
    out, err = capfd.readouterr()
    assert out == "" and "\r" not in err and "|#" not in err and "█" not in err
    assert [line.split(" |")[0] for line in _rows_in(err)] == ["step 2", "step 4"] * 2


def test_on_a_terminal_a_call_draws_a_bar_and_writes_each_line_above_it(corpus, tmp_path,
                                                                          monkeypatch, capfd):
    """On a terminal, the bar on stderr, the rows above it on stdout, and each notice of
    the log on a line of its own above the bar, never drawn into its frame."""
    pytest.importorskip("tqdm")
    tok, ds = corpus
    with as_in_a_notebook():
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
        minibert.train(tiny_model(tok), ds, collator(tok),
                       train_config(max_steps=4, log_every=2, save_every=2, progress=True),
                       tmp_path)
    out, err = capfd.readouterr()
    assert "4/4" in err  # the bar, on stderr
    assert len(_rows_in(out)) == 2  # the rows, written above it
    # tqdm clears the bar's line ("\r", blanks, "\r") and writes a notice from its start
    saved = [line.split("\r")[-1] for line in err.split("\n") if "saved checkpoint" in line]
    assert len(saved) == 2 and all(line.startswith("saved checkpoint ") for line in saved), err


def test_without_a_terminal_a_call_draws_no_bar(corpus, tmp_path, capfd):
    """Into a file (here pytest's), a bar's frames would join into one line of carriage
    returns: the rows are log lines instead, with the notices."""
    pytest.importorskip("tqdm")
    tok, ds = corpus
    with as_in_a_notebook():
        minibert.train(tiny_model(tok), ds, collator(tok),
                       train_config(max_steps=4, log_every=2, progress=True), tmp_path)
    out, err = capfd.readouterr()
    assert out == "" and "\r" not in err and "4/4" not in err
    assert [line.split(" |")[0] for line in _rows_in(err)] == ["step 2", "step 4"]
    assert "saved checkpoint" in err


def test_only_rank_0_shows_progress(corpus, tmp_path, monkeypatch, capfd):
    """A rank other than 0 draws no bar and shows no line, with tqdm or without, not even
    one it logs itself (a step past the schedule's horizon, said on every rank), which rank
    0 shows. (Here one process whose context says it is not the main rank: it computes as
    rank 0 would, and writes and shows nothing, as every rank but 0 does.)"""
    from minibert.training.distributed import DistContext

    class NotMain(DistContext):
        @property
        def is_main(self) -> bool:
            return False

    tok, ds = corpus
    cfg = train_config(max_steps=3, decay_steps=2, warmup=1, log_every=1, progress=True)
    with as_in_a_notebook():
        minibert.train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "a", ctx=NotMain())
        _without_tqdm(monkeypatch)
        minibert.train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "b", ctx=NotMain())
        assert capfd.readouterr() == ("", "")
        minibert.train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "main")
    assert "past the schedule's horizon" in capfd.readouterr().err
