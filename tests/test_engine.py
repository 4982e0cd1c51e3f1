"""The training loop against independent references: a full batch against accumulated
micro-batches, an interrupted run against an uninterrupted one, and injected failures."""

import json
import logging
import signal
import time
from dataclasses import replace

import pytest
import torch

import minibert
from engine_utils import (FP32_RUNS_APART, MODERN_TINY, collator, same_logged_losses,
                          sigterm_in_forward, tiny_corpus, tiny_model, train_config)
from facts import raises
from minibert.training.checkpoint import latest_checkpoint, load_checkpoint
from minibert.training.engine import TrainConfig, TrainingError, micro_step_weight, train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _losses(out_dir):
    rows = [json.loads(line) for line in open(out_dir / "metrics.jsonl")]
    return [r["loss"] for r in rows if "loss" in r]


def _max_rel_diff(m1, m2):
    """max over parameter tensors of ||p - q|| / ||q||."""
    return max(((p - q).norm() / q.norm().clamp_min(1e-12)).item()
               for p, q in zip(m1.parameters(), m2.parameters()))


@pytest.mark.parametrize("arch", [{}, MODERN_TINY], ids=["classic", "modern"])
def test_accumulation_is_exact(corpus, tmp_path, arch):
    """Batch 16 in one micro-batch == 4 micro-batches of 4 (dropout 0, fp32)."""
    tok, ds = corpus
    full, accum = tiny_model(tok, **arch), tiny_model(tok, **arch)
    train(full, ds, collator(tok), train_config(), tmp_path / "full")
    train(accum, ds, collator(tok), train_config(micro_batch_size=4), tmp_path / "accum")
    a, b = _losses(tmp_path / "full"), _losses(tmp_path / "accum")
    assert len(a) == 6 and a[-1] < a[0]
    assert same_logged_losses(a, b)
    assert _max_rel_diff(full, accum) <= FP32_RUNS_APART


def test_mean_of_means_would_not_be_exact():
    """The reference the weight guards against: micro-batches with unequal target counts."""
    counts = [1, 7]
    weights = [micro_step_weight(n, sum(counts), 1) for n in counts]
    assert weights == [1 / 8, 7 / 8]  # not [1/2, 1/2]


@pytest.mark.parametrize("arch", [{}, MODERN_TINY], ids=["classic", "modern"])
def test_resume_after_sigterm_is_exact(corpus, tmp_path, arch):
    tok, ds = corpus
    uninterrupted = tiny_model(tok, dropout=0.1, **arch)
    train(uninterrupted, ds, collator(tok), train_config(), tmp_path / "ref")

    collate = collator(tok)
    # during step 3: the step finishes, is saved, and the run stops
    first = sigterm_in_forward(tiny_model(tok, dropout=0.1, **arch), 3)
    result = train(first, ds, collate, train_config(), tmp_path / "run")
    assert result["interrupted"] and result["steps"] == 3
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "step_00000003"
    resumed = tiny_model(tok, seed=123, dropout=0.1, **arch)  # all of it is restored
    result = train(resumed, ds, collate, train_config(), tmp_path / "run", resume=True)
    assert result["steps"] == 6 and result["steps_this_run"] == 3
    assert _losses(tmp_path / "run") == _losses(tmp_path / "ref")
    assert all(torch.equal(p, q) for p, q in zip(resumed.parameters(),
                                                 uninterrupted.parameters()))


def test_resume_refuses_other_settings_and_missing_checkpoints(corpus, tmp_path):
    tok, ds = corpus
    with raises(FileNotFoundError, "--resume", str(tmp_path / "checkpoints")):
        train(tiny_model(tok), ds, collator(tok), train_config(), tmp_path, resume=True)
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2), tmp_path)
    with raises(ValueError, "batch_size", "16", "32") as info:  # the setting, then and now
        train(tiny_model(tok), ds, collator(tok), train_config(batch_size=32, max_steps=4),
              tmp_path, resume=True)
    assert info.value.diffs == [("batch_size", "16", "32")]
    with pytest.raises(ValueError, match="model num_layers"):
        train(tiny_model(tok, num_layers=3), ds, collator(tok), train_config(max_steps=4),
              tmp_path, resume=True)


def _fits_only_small_batches(model, from_call: int = 1):
    """`model`, whose forward runs out of memory on more than 4 sequences at once, from its
    `from_call`-th call on."""
    forward, calls = model.forward, []

    def small_batches_only(input_ids, *args, **kwargs):
        calls.append(1)
        if input_ids.shape[0] > 4 and len(calls) >= from_call:
            raise torch.OutOfMemoryError("fake: tried to allocate 2.00 GiB")
        return forward(input_ids, *args, **kwargs)

    model.forward = small_batches_only
    return model


def test_out_of_memory_halves_the_micro_batch_and_stays_exact(corpus, tmp_path):
    tok, ds = corpus
    reference = tiny_model(tok)
    train(reference, ds, collator(tok), train_config(max_steps=3), tmp_path / "ref")

    model = _fits_only_small_batches(tiny_model(tok))
    cfg = train_config(max_steps=3, auto_micro_batch=True)
    train(model, ds, collator(tok), cfg, tmp_path / "oom")
    assert same_logged_losses(_losses(tmp_path / "oom"), _losses(tmp_path / "ref"))
    assert _max_rel_diff(model, reference) <= FP32_RUNS_APART

    failing = _fits_only_small_batches(tiny_model(tok))
    with raises(TrainingError, "out of memory", "(16, 32)", "--micro-batch-size"):
        train(failing, ds, collator(tok), train_config(max_steps=3), tmp_path / "no-auto")


def test_out_of_memory_after_steps_that_fitted_cuts_that_batch_again(corpus, tmp_path):
    """Step 3 runs out of memory after two steps fitted (a longer batch, a fuller heap): its
    global batch, prepared while step 2 ran, is cut again into the smaller micro-batches,
    and the run is the one that fitted throughout."""
    tok, ds = corpus
    reference = tiny_model(tok)
    train(reference, ds, collator(tok), train_config(max_steps=4), tmp_path / "ref")
    model = _fits_only_small_batches(tiny_model(tok), from_call=3)
    result = train(model, ds, collator(tok), train_config(max_steps=4, auto_micro_batch=True),
                   tmp_path / "oom")
    assert result["steps"] == 4
    assert same_logged_losses(_losses(tmp_path / "oom"), _losses(tmp_path / "ref"))
    assert _max_rel_diff(model, reference) <= FP32_RUNS_APART


def test_evaluation_uses_the_micro_batch_an_out_of_memory_backed_off_to(corpus, tmp_path):
    """After a back-off the run is known to fit only the smaller micro-batch: evaluation
    (which gives the same numbers at any micro-batch size) uses it too, and an eval_fn
    running out of memory is one clear error, not torch's."""
    tok, ds = corpus
    cfg = train_config(max_steps=4, eval_every=2, eval_batches=1)
    reference = train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "ref", eval_set=ds)
    model = _fits_only_small_batches(tiny_model(tok))
    result = train(model, ds, collator(tok), replace(cfg, auto_micro_batch=True),
                   tmp_path / "oom", eval_set=ds)
    assert result["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-5)

    def hungry_eval(model, precision):
        raise torch.OutOfMemoryError("fake: tried to allocate 9.00 GiB")

    with raises(TrainingError, "out of memory", "evaluation", "step 2",
                "fake: tried to allocate 9.00 GiB", "--micro-batch-size"):
        train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "eval", eval_fn=hungry_eval)


def test_auto_micro_batch_is_refused_under_ddp_before_any_collective(corpus, tmp_path):
    """A rank that backs off alone retries its forward while the others wait in the
    gradient all-reduce: the job would hang or crash, so the setting is refused by name."""
    from minibert.training.distributed import DistContext

    tok, ds = corpus
    with raises(ValueError, "auto_micro_batch", "DDP", "--micro-batch-size"):
        train(tiny_model(tok), ds, collator(tok), train_config(auto_micro_batch=True),
              tmp_path, ctx=DistContext(rank=0, world_size=2))
    assert not tmp_path.joinpath("checkpoints").exists()


def _nan_model(tok, bad_calls, snapshots=None):
    """A model whose forward returns a NaN loss on the given call numbers."""
    model = tiny_model(tok)
    forward, calls = model.forward, {"n": 0}

    def forward_with_nans(*args, **kwargs):
        calls["n"] += 1
        out = forward(*args, **kwargs)
        if snapshots is not None:
            snapshots.append([p.detach().clone() for p in model.parameters()])
        return replace(out, loss=out.loss * float("nan")) if calls["n"] in bad_calls else out

    model.forward = forward_with_nans
    return model


def test_non_finite_step_is_skipped_and_counted(corpus, tmp_path):
    tok, ds = corpus
    snapshots = []
    model = _nan_model(tok, bad_calls={3}, snapshots=snapshots)
    result = train(model, ds, collator(tok), train_config(max_steps=3), tmp_path)
    def strict(token):
        raise ValueError(f"{token} is not JSON")

    rows = [json.loads(line, parse_constant=strict) for line in open(tmp_path / "metrics.jsonl")]
    assert result["skipped_steps"] == 1 and [r["skipped"] for r in rows[:3]] == [0, 0, 1]
    assert rows[2]["loss"] is None  # NaN, written as JSON's null for jq and JavaScript alike
    # step 3 (the third forward) was skipped: the weights are those it started from
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), snapshots[2]))
    assert not all(torch.equal(p, q) for p, q in zip(snapshots[1], snapshots[2]))


def test_out_of_memory_in_the_optimizer_step_is_one_clear_error(corpus, tmp_path,
                                                                 monkeypatch):
    """AdamW's state is allocated at the first step, after the backward pass, where a smaller
    micro-batch cannot help: the run stops with a TrainingError that says so, not a raw
    OutOfMemoryError, and the checkpoint of the step before is kept."""
    import minibert.training.engine

    tok, ds = corpus
    build = minibert.training.run.build_optimizer

    def failing_at_the_third_step(*args, **kwargs):
        optimizer, calls = build(*args, **kwargs), []
        step = optimizer.step

        def step_or_fail(*a, **k):
            calls.append(1)
            if len(calls) == 3:
                raise torch.OutOfMemoryError("fake: tried to allocate 2.00 GiB")
            return step(*a, **k)

        optimizer.step = step_or_fail
        return optimizer

    monkeypatch.setattr(minibert.training.run, "build_optimizer", failing_at_the_third_step)
    with raises(TrainingError, "out of memory", "step 3", "optimizer step", "MB",
                "fake: tried to allocate 2.00 GiB"):
        train(tiny_model(tok), ds, collator(tok),
              train_config(max_steps=4, save_every=1, auto_micro_batch=True), tmp_path)
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000002"


def test_consecutive_non_finite_steps_stop_the_run(corpus, tmp_path):
    tok, ds = corpus
    model = _nan_model(tok, bad_calls=set(range(3, 100)))
    with raises(TrainingError, "3 consecutive", "non-finite", str(tmp_path / "checkpoints")):
        train(model, ds, collator(tok), train_config(max_steps=8, max_bad_steps=3,
                                                     save_every=1), tmp_path)
    # the last good checkpoint (step 2) is kept, no bad one was written after it
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000002"


def test_metrics_rows(corpus, tmp_path):
    tok, ds = corpus
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=4, log_every=2,
                                                           eval_every=2), tmp_path,
          eval_set=ds)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [2, 4]
    for key in ("lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_mb"):
        assert all(r[key] >= 0 for r in train_rows), key
    assert train_rows[0]["tokens_per_s"] > 0 and train_rows[0]["peak_mem_mb"] > 10
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert 0 <= evals[-1]["eval_accuracy"] <= 1
    assert evals[-1]["perplexity"] == pytest.approx(2.718281828 ** evals[-1]["eval_loss"])


def _ceiling_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("MFU ceiling")]


def test_the_mfu_ceiling_is_measured_once_per_machine_whatever_the_load(corpus, tmp_path,
                                                                         monkeypatch, caplog):
    """Timed at every start, the ceiling came out low on a busy machine and the logged MFU
    high. It is measured once, recorded, and read back by every later run: two runs of one
    command state the same ceiling however fast a measurement would come out now, and a row
    that beats it is said, not measured again (which would tie the figure to the load)."""
    import minibert.training.engine
    import minibert.machine.meters

    tok, ds = corpus
    monkeypatch.setenv("MINIBERT_CACHE", str(tmp_path / "cache"))
    ceilings = iter([1e3, 1e13, 1e5, 1e11, 1e7, 1e9])  # a busy machine, then a quiet one...
    calls = []

    def fake_peak(*args, **kwargs):
        calls.append(args)
        return next(ceilings)

    monkeypatch.setattr(minibert.machine.meters, "measure_peak_flops", fake_peak)
    ratios = []
    with caplog.at_level(logging.INFO, logger="minibert"):
        for run in ("a", "b"):
            train(tiny_model(tok), ds, collator(tok), train_config(max_steps=3, peak_flops=None),
                  tmp_path / run)
            rows = [json.loads(line) for line in open(tmp_path / run / "metrics.jsonl")]
            # mfu / tokens_per_s = model FLOPs per token / ceiling: the same in both runs
            ratios.append([r["mfu"] / r["tokens_per_s"] for r in rows if "mfu" in r])
    assert len(calls) == 1, calls
    lines = _ceiling_lines(caplog)
    # "MFU ceiling: <rate> (fp32 matmuls), <where it came from>": the first run measured and
    # recorded it, the second read it back.
    assert len(lines) == 2, lines
    assert lines[0].partition("), ")[0] == lines[1].partition("), ")[0], lines
    assert all(str(tmp_path / "cache" / "mfu_ceilings.json") in line for line in lines), lines
    assert "measured now" in lines[0] and "measured now" not in lines[1], lines
    assert ratios[0] == pytest.approx(ratios[1], rel=1e-3)
    # 1e3 FLOP/s is far below what training reaches: said once a run, as a warning.
    beaten = [r for r in caplog.records if r.levelno == logging.WARNING and "above" in
              r.getMessage() and "ceiling" in r.getMessage()]
    assert len(beaten) == 2, [r.getMessage() for r in caplog.records]


def test_a_given_peak_flops_is_the_ceiling_and_nothing_is_measured(corpus, tmp_path,
                                                                   monkeypatch, caplog):
    import minibert.training.engine
    import minibert.machine.meters

    tok, ds = corpus
    monkeypatch.setenv("MINIBERT_CACHE", str(tmp_path / "cache"))
    fail = lambda *a, **k: pytest.fail("a given ceiling is not measured")  # noqa: E731
    monkeypatch.setattr(minibert.machine.meters, "measure_peak_flops", fail)
    with caplog.at_level(logging.INFO, logger="minibert"):
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2, peak_flops=2e11),
              tmp_path / "run")
    lines = _ceiling_lines(caplog)
    assert len(lines) == 1 and "200 GFLOP/s" in lines[0] and "peak_flops" in lines[0], lines
    assert not (tmp_path / "cache").exists()


def test_precision_auto_states_its_decision_and_reason_in_one_line(corpus, tmp_path,
                                                                   monkeypatch, caplog):
    import minibert.machine.precision as precision

    tok, ds = corpus
    for cache in [f for f in vars(precision).values() if hasattr(f, "cache_clear")]:
        cache.cache_clear()  # as in a new process
    monkeypatch.setattr(precision, "_read_cpuinfo",
                        lambda: "model name\t: Some CPU\nflags\t\t: fpu avx2 amx_bf16\n")
    with caplog.at_level(logging.INFO, logger="minibert"):
        result = train(tiny_model(tok), ds, collator(tok),
                       train_config(max_steps=2, precision="auto"), tmp_path / "run")
    for cache in [f for f in vars(precision).values() if hasattr(f, "cache_clear")]:
        cache.cache_clear()
    lines = [r.getMessage() for r in caplog.records if "precision auto" in r.getMessage()]
    assert result["precision"] == "bf16"
    assert lines == ["precision auto: bf16 (this CPU reports amx_bf16: native bf16 matmuls)"]


def test_training_time_leaves_out_evaluation_and_survives_resume(corpus, tmp_path):
    """`train_seconds` and tokens/s count the steps only: an evaluation that takes 0.4 s after
    every step shows in the wall time, not in them. A resumed run adds to the saved total."""
    tok, ds = corpus

    def slow_eval(model, precision):
        time.sleep(0.4)
        return {"eval_loss": 1.0}

    cfg = train_config(max_steps=3, eval_every=1, save_every=2)
    result = train(tiny_model(tok), ds, collator(tok), cfg, tmp_path, eval_fn=slow_eval)
    # Evaluations after steps 1 and 2 fall inside the wall time; the final one comes after it.
    assert result["train_seconds"] < result["wall_seconds"] - 0.8
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    seconds = [r["train_seconds"] for r in rows if "loss" in r]
    assert seconds == sorted(seconds) and seconds[-1] == result["train_seconds"]
    # Rows after an evaluation: the window's tokens over its own step time, not 0.4 s more
    # (the time it implies is compared with the logged step time, so a slow machine passes).
    for r, before in zip([r for r in rows if "loss" in r][1:], seconds):
        assert abs(16 * 32 / r["tokens_per_s"] - (r["train_seconds"] - before)) < 0.1, r
    assert all("train_seconds" in r for r in rows if "eval_loss" in r)
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))["train_state"]
    assert saved["train_seconds"] == pytest.approx(result["train_seconds"], abs=1e-3)
    more = train(tiny_model(tok), ds, collator(tok), replace(cfg, max_steps=5), tmp_path,
                 eval_fn=slow_eval, resume=True)
    assert more["train_seconds"] > saved["train_seconds"]
    assert more["train_seconds"] < saved["train_seconds"] + more["wall_seconds"] - 0.4


def test_eval_at_start_logs_step_0_and_changes_no_weight(corpus, tmp_path):
    """`eval_at_start` scores the model before its first step (the "before" of a continued
    training), in a row at step 0 on a fresh start only; the run trains as without it."""
    tok, ds = corpus
    cfg = train_config(max_steps=4, eval_every=2, save_every=2)
    plain = tiny_model(tok, dropout=0.1)
    train(plain, ds, collator(tok), cfg, tmp_path / "plain", eval_set=ds)
    first = tiny_model(tok, dropout=0.1)
    train(first, ds, collator(tok), replace(cfg, eval_at_start=True), tmp_path / "first",
          eval_set=ds)
    assert all(torch.equal(p, q) for p, q in zip(plain.state_dict().values(),
                                                  first.state_dict().values()))
    rows = [json.loads(line) for line in open(tmp_path / "first" / "metrics.jsonl")]
    assert "eval_loss" in rows[0] and rows[0]["step"] == 0
    assert [r["step"] for r in rows if "eval_loss" in r] == [0, 2, 4]
    # a resume is not a start: no second row at step 0
    train(tiny_model(tok, dropout=0.1), ds, collator(tok),
          replace(cfg, max_steps=6, eval_at_start=True),
          tmp_path / "first", eval_set=ds, resume=True)
    rows = [json.loads(line) for line in open(tmp_path / "first" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "eval_loss" in r] == [0, 2, 4, 6]


def test_the_time_left_counts_the_longer_steps_to_come():
    """8 steps of a sequence-length warmup from 16 to 32 over 4: lengths 16 24 24 32 | 32 32
    32 32 (seq_len_at). After step 4, 9.6 s for 96 positions is 0.1 s a position: the 128
    positions left take 12.8 s, and the one evaluation left (the final; step 4's is done)
    2 s. Counted in steps, as a tqdm bar counts, it would say 9.6 + 2."""
    from types import SimpleNamespace
    from minibert.training.run import Around
    from minibert.training.state import TrainState

    run = SimpleNamespace(cfg=train_config(max_steps=8, eval_every=4, seq_len_start=16),
                          seq_warmup=4)
    around = SimpleNamespace(run=run, widest=32, eval_seconds=2.0)
    state = TrainState(step=4, train_seconds=9.6)
    assert Around.time_left(around, state) == pytest.approx(14.8)
    run.seq_warmup = 0  # no warmup: every step alike
    assert Around.time_left(around, state) == pytest.approx(9.6 + 2.0)


def test_bad_train_config():
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)


def test_micro_batch_must_divide_the_batch(corpus, tmp_path):
    tok, ds = corpus
    with raises(ValueError, "batch_size=16", "micro_batch_size=5"):
        train(tiny_model(tok), ds, collator(tok), train_config(micro_batch_size=5), tmp_path)


def test_fp16_on_cpu_is_refused(corpus, tmp_path):
    tok, ds = corpus
    with raises(ValueError, "--precision fp16", "CUDA"):

        train(tiny_model(tok), ds, collator(tok), train_config(precision="fp16"), tmp_path)


def test_bf16_trains_on_cpu(corpus, tmp_path):
    tok, ds = corpus
    result = train(tiny_model(tok), ds, collator(tok), train_config(precision="bf16"), tmp_path)
    losses = _losses(tmp_path)
    assert result["precision"] == "bf16" and losses[-1] < losses[0]


def test_fp16_loss_scaling_skips_overflow_steps(corpus, tmp_path, monkeypatch):
    """The GradScaler path, run on CPU: an inf gradient skips the step and halves the scale.

    fp16 is refused on CPU for real runs (it is slow there); here resolve_precision is
    patched so that the scaler logic itself is exercised without a GPU.
    """
    import minibert.training.run

    monkeypatch.setattr(minibert.training.run, "resolve_precision",
                        lambda precision, device: "fp16")
    tok, ds = corpus
    model = tiny_model(tok)
    snapshots, calls = [], {"n": 0}
    forward = model.forward

    def forward_with_overflow(*args, **kwargs):
        calls["n"] += 1
        snapshots.append([p.detach().clone() for p in model.parameters()])
        out = forward(*args, **kwargs)
        if calls["n"] == 2:  # finite loss, infinite gradient
            out.loss.register_hook(lambda g: g * float("inf"))
        return out

    model.forward = forward_with_overflow
    result = train(model, ds, collator(tok), train_config(max_steps=4), tmp_path)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert result["precision"] == "fp16" and result["skipped_steps"] == 1
    assert [r["skipped"] for r in rows[:4]] == [0, 1, 1, 1]
    assert all(torch.equal(p, q) for p, q in zip(snapshots[1], snapshots[2]))  # step 2 skipped
    assert not all(torch.equal(p, q) for p, q in zip(snapshots[2], snapshots[3]))
    assert rows[-1]["loss"] < rows[0]["loss"]


def test_compiled_model_checkpoints_have_plain_names(corpus, tmp_path):
    tok, ds = corpus
    model = tiny_model(tok)
    train(model, ds, collator(tok), train_config(max_steps=2, compile=True), tmp_path)
    from minibert.training.checkpoint import load_checkpoint

    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert set(state["model"]) == set(model.state_dict())
    assert not any("_orig_mod" in k for k in state["model"])


def test_classification_with_length_grouping_and_eval_fn(tmp_path):
    """The engine beyond MLM: a classifier, length-grouped batches, a custom evaluation."""
    import minibert
    from minibert.data import pad_batch

    g = torch.Generator().manual_seed(0)
    examples = []
    for i in range(96):
        n = int(torch.randint(4, 40, (1,), generator=g))
        ids = torch.randint(5, 50, (n,), generator=g)
        examples.append({"input_ids": [2] + ids.tolist() + [3], "label": int(ids[0] < 27)})
    shapes = []

    def collate(batch, epoch=None):
        ids, lengths = pad_batch([e["input_ids"] for e in batch], pad_id=0)
        shapes.append(ids.shape)
        ids = torch.from_numpy(ids)
        mask = (torch.arange(ids.shape[1])[None] < torch.from_numpy(lengths)[:, None]).long()
        return {"input_ids": ids, "attention_mask": mask,
                "labels": torch.tensor([e["label"] for e in batch])}

    calls = []

    def eval_fn(model, precision):
        calls.append(model.training)
        return {"accuracy": 0.5}

    minibert.set_seed(0)
    model = minibert.BertForSequenceClassification(
        minibert.BertConfig.preset("tiny", vocab_size=64, max_position_embeddings=64), 2)
    lengths = [len(e["input_ids"]) for e in examples]
    cfg = train_config(batch_size=8, max_steps=12, eval_every=6)
    result = train(model, examples, collate, cfg, tmp_path / "grouped", lengths=lengths,
                   eval_fn=eval_fn)
    grouped = sum(b * t for b, t in shapes)
    shapes.clear()
    minibert.set_seed(0)
    model = minibert.BertForSequenceClassification(
        minibert.BertConfig.preset("tiny", vocab_size=64, max_position_embeddings=64), 2)
    train(model, examples, collate, cfg, tmp_path / "shuffled")
    shuffled = sum(b * t for b, t in shapes)
    assert grouped < 0.8 * shuffled  # far less padding, same examples
    assert result["accuracy"] == 0.5 and calls == [False, False]  # eval mode, twice
    rows = [json.loads(line) for line in open(tmp_path / "grouped" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "accuracy" in r] == [6, 12]


def test_eval_fn_scores_come_back_whole(corpus, tmp_path):
    """An evaluation's tables and predictions come back in result["scores"]; only its
    numbers are logged and added to the result."""
    tok, ds = corpus
    seen = []

    def eval_fn(model, precision):
        seen.append(len(seen))
        return {"accuracy": 0.25 * len(seen), "per_class": {"a": 1.0}, "preds": [1, 0],
                "ok": True}

    def constant(model, precision):
        return 0.5

    result = train(tiny_model(tok), ds, collator(tok), train_config(max_steps=4, eval_every=2),
                   tmp_path, eval_fn=eval_fn)
    assert result["scores"] == {"accuracy": 0.5, "per_class": {"a": 1.0}, "preds": [1, 0],
                                "ok": True}  # the last evaluation's, whole
    assert result["accuracy"] == 0.5 and "preds" not in result and "ok" not in result
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["accuracy"] for r in rows if "accuracy" in r] == [0.25, 0.5]
    assert not any("per_class" in r or "ok" in r for r in rows)
    with pytest.raises(TypeError, match="mapping"):
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2, warmup=1),
              tmp_path / "b", eval_fn=constant)


def _subset(ds, n):
    return torch.utils.data.Subset(ds, list(range(n)))


def test_accumulation_is_exact_with_a_smaller_last_batch(corpus, tmp_path):
    """37 examples at batch 16: every third step is the epoch's last batch, of 5 examples.
    Its micro-batches of 4 and 1 must give what one batch of 5 gives."""
    tok, ds = corpus
    small = _subset(ds, 37)
    full, accum = tiny_model(tok), tiny_model(tok)
    train(full, small, collator(tok), train_config(), tmp_path / "full")
    train(accum, small, collator(tok), train_config(micro_batch_size=4), tmp_path / "accum")
    a, b = _losses(tmp_path / "full"), _losses(tmp_path / "accum")
    assert len(a) == 6 and a[-1] < a[0]
    assert same_logged_losses(a, b)
    # fp32 rounding in AdamW's early steps, as with whole batches; weighting the
    # micro-batches of 4 and 1 equally instead would differ by about 1e-2.
    assert _max_rel_diff(full, accum) <= FP32_RUNS_APART
    state = load_checkpoint(latest_checkpoint(tmp_path / "full" / "checkpoints"))["train_state"]
    assert (state["epoch"], state["consumed"]) == (1, 37)  # two whole epochs, none dropped


def test_resume_at_a_smaller_last_batch_is_exact(corpus, tmp_path):
    tok, ds = corpus
    small = _subset(ds, 37)
    reference = tiny_model(tok, dropout=0.1)
    train(reference, small, collator(tok), train_config(), tmp_path / "ref")
    first = tiny_model(tok, dropout=0.1)
    result = train(first, small, collator(tok), train_config(max_steps=3, decay_steps=6),
                   tmp_path / "run")
    assert result["steps"] == 3  # its last step was the epoch's batch of 5
    resumed = tiny_model(tok, seed=123, dropout=0.1)
    train(resumed, small, collator(tok), train_config(), tmp_path / "run", resume=True)
    assert _losses(tmp_path / "run") == _losses(tmp_path / "ref")
    assert all(torch.equal(p, q) for p, q in zip(resumed.parameters(), reference.parameters()))


def test_a_resumed_run_keeps_the_micro_batch_it_backed_off_to(corpus, tmp_path):
    """The micro-batch an out-of-memory error halved to is saved with the state: the resumed
    run starts with it instead of running out of memory again to find it, unless the resume
    sets a micro-batch of its own."""
    tok, ds = corpus
    sizes = []

    def limited(model):
        forward = model.forward

        def small_batches_only(input_ids, *args, **kwargs):
            sizes.append(input_ids.shape[0])
            if input_ids.shape[0] > 4:
                raise torch.OutOfMemoryError("fake: tried to allocate 2.00 GiB")
            return forward(input_ids, *args, **kwargs)

        model.forward = small_batches_only
        return model

    cfg = train_config(max_steps=2, auto_micro_batch=True)
    train(limited(tiny_model(tok)), ds, collator(tok), cfg, tmp_path)
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))["train_state"]
    assert state["micro_batch_size"] == 4
    sizes.clear()
    train(limited(tiny_model(tok)), ds, collator(tok), replace(cfg, max_steps=3), tmp_path,
          resume=True)
    assert sizes == [4, 4, 4, 4]  # no attempt at 16 or 8
    sizes.clear()
    train(limited(tiny_model(tok)), ds, collator(tok),
          replace(cfg, max_steps=4, micro_batch_size=2), tmp_path, resume=True)
    assert sizes == [2] * 8


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_resume_with_another_micro_batch_says_when_dropout_makes_it_inexact(
        corpus, tmp_path, caplog, dropout):
    """Dropout's masks are drawn one micro-batch at a time: with dropout on, a resume with
    another micro-batch goes on with other masks, which used to pass without a word."""
    tok, ds = corpus
    cfg = train_config(max_steps=2, micro_batch_size=16)
    train(tiny_model(tok, dropout=dropout), ds, collator(tok), cfg, tmp_path)
    with caplog.at_level(logging.WARNING, logger="minibert"):
        train(tiny_model(tok, dropout=dropout), ds, collator(tok),
              replace(cfg, max_steps=3, micro_batch_size=4), tmp_path, resume=True)
    warned = "micro-batch 4, was 16, with dropout on" in caplog.text
    assert warned == (dropout > 0)


def test_a_resume_on_another_thread_count_says_it_is_not_bit_for_bit(corpus, tmp_path,
                                                                  caplog):
    """A CPU splits each reduction across its threads, and another split rounds otherwise:
    the same run resumed on another thread count goes on equivalent, not bit for bit. It
    used to say nothing; on the same count it still says nothing."""
    tok, ds = corpus
    cfg = train_config(max_steps=2)
    threads = torch.get_num_threads()
    train(tiny_model(tok), ds, collator(tok), cfg, tmp_path)
    with caplog.at_level(logging.WARNING, logger="minibert"):
        train(tiny_model(tok), ds, collator(tok), replace(cfg, max_steps=3), tmp_path,
              resume=True)
    assert "not bit for bit" not in caplog.text
    caplog.clear()
    torch.set_num_threads(threads + 1)
    try:
        with caplog.at_level(logging.WARNING, logger="minibert"):
            train(tiny_model(tok), ds, collator(tok), replace(cfg, max_steps=4), tmp_path,
                  resume=True)
    finally:
        torch.set_num_threads(threads)
    assert f"torch_threads {threads + 1}, was {threads}" in caplog.text
    assert "not bit for bit" in caplog.text


def test_deterministic_changes_nothing_a_cpu_computes(corpus, tmp_path):
    """docs/runs.md, "The same result": a CPU run is already the same bit for bit at a fixed
    thread count, so --deterministic (rng.set_seed's deterministic=True) adds nothing to
    it; dropout on, so that its masks are drawn too."""
    tok, ds = corpus
    weights = []
    for deterministic in (False, True):
        try:
            minibert.set_seed(0, deterministic=deterministic)
            model = tiny_model(tok, dropout=0.1)
            train(model, ds, collator(tok), train_config(max_steps=3),
                  tmp_path / str(deterministic))
        finally:
            torch.use_deterministic_algorithms(False)
            torch.backends.cudnn.deterministic = False
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(*weights)


def test_the_final_evaluation_is_logged_once_however_the_run_was_stopped(corpus, tmp_path,
                                                                        monkeypatch):
    """A run killed during its final evaluation (its last checkpoint saved) and resumed, and
    a run stopped by a signal at its last step and finished, never logged that evaluation."""
    import minibert.training.engine

    tok, ds = corpus
    evaluate = minibert.training.run.evaluate

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("the second SIGTERM")

    cfg = train_config(max_steps=2)
    monkeypatch.setattr(minibert.training.run, "evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "run", eval_set=ds)
    monkeypatch.setattr(minibert.training.run, "evaluate", evaluate)
    for _ in range(2):  # resumed, then resumed again when already finished
        train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "run", eval_set=ds,
              resume=True)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "eval_loss" in r] == [2]


def test_a_signal_during_the_last_step_stops_the_run_before_its_evaluation(corpus, tmp_path):
    """It was answered with the final evaluation and a normal finish, so a script exited 0
    (and exported) instead of 128 + N, and a long evaluation could outlast the grace time."""
    tok, ds = corpus
    collate, cfg = collator(tok), train_config(max_steps=2)
    result = train(sigterm_in_forward(tiny_model(tok), 2), ds, collate, cfg, tmp_path,
                   eval_set=ds)  # during step 2 of 2
    assert result["interrupted"] and result["stop_signal"] == signal.SIGTERM
    assert "eval_loss" not in result
    done = train(tiny_model(tok), ds, collate, cfg, tmp_path, eval_set=ds, resume=True)
    assert not done["interrupted"] and done["steps_this_run"] == 0 and "eval_loss" in done
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows if "eval_loss" in r] == [2]


@pytest.mark.parametrize("kind", ["sequence", "token", "mlm"])
def test_a_classifiers_logged_flops_are_the_encoders_alone(corpus, tmp_path, monkeypatch, kind):
    """MFU counts the MLM decoder only where there is one: a classifier's step is the
    encoder's FLOPs alone, a masked LM's adds the sparse head on its predicted tokens. Both
    the FLOPs the engine asks for and the logged mfu (mfu * ceiling / tokens_per_s is the
    FLOPs of a token) are checked."""
    import minibert
    import minibert.training.engine
    from minibert.machine.meters import flops_per_token

    tok, ds = corpus
    fractions = []

    def spy(config, seq_len, mlm_fraction=None):
        fractions.append(mlm_fraction)
        return flops_per_token(config, seq_len, mlm_fraction=mlm_fraction)

    monkeypatch.setattr(minibert.training.run, "flops_per_token", spy)
    mlm = collator(tok)

    def collate(examples, epoch=0):
        batch = mlm(examples, epoch=epoch)
        ids = batch["input_ids"]
        if kind == "sequence":
            batch["labels"] = ids[:, 1] % 2
        elif kind == "token":
            batch["labels"] = ids % 2
        return batch

    if kind == "mlm":
        model = tiny_model(tok)
    else:
        minibert.set_seed(0)
        config = minibert.BertConfig.preset("tiny", vocab_size=tok.vocab_size,
                                            max_position_embeddings=64)
        cls = (minibert.BertForSequenceClassification if kind == "sequence"
               else minibert.BertForTokenClassification)
        model = cls(config, 2)
    peak = 1e6  # low, so that the rounded mfu keeps its digits
    train(model, ds, collate, train_config(max_steps=2, peak_flops=peak), tmp_path)
    assert len(fractions) == 2
    if kind == "mlm":
        assert all(0.05 < f < 0.3 for f in fractions), fractions  # ~15% of tokens masked
    else:
        assert fractions == [0.0, 0.0]
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    encoder = flops_per_token(model.config, 32, mlm_fraction=0.0)
    for row in rows:
        per_token = row["mfu"] * peak / row["tokens_per_s"]
        if kind == "mlm":
            assert per_token > encoder * 1.002  # the head adds about a percent here
        else:
            assert per_token == pytest.approx(encoder, rel=1e-3)


@pytest.mark.parametrize("handle", [True, False])
def test_handle_signals_off_leaves_the_processs_handlers_alone(corpus, tmp_path, handle):
    """handle_signals=False: train installs no handler, so the one in place before (a
    notebook's, a caller's) is the one a SIGINT meets during a step."""
    import minibert

    tok, ds = corpus
    seen = []

    class Watching(minibert.BertForMaskedLM):
        def forward(self, *args, **kwargs):
            seen.append(signal.getsignal(signal.SIGINT))
            return super().forward(*args, **kwargs)

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, mine)
    try:
        train(Watching(tiny_model(tok).config), ds, collator(tok),
              train_config(max_steps=2, handle_signals=handle), tmp_path)
        assert signal.getsignal(signal.SIGINT) is mine  # put back either way
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(seen) == 2
    assert all((h is mine) != handle for h in seen), seen


@pytest.mark.parametrize("release", [True, False])
def test_release_memory_off_never_trims_the_heap(corpus, tmp_path, monkeypatch, release):
    """release_memory=False: no hand-back of glibc's free memory, neither at a new sequence
    length nor every RELEASE_EVERY steps."""
    import minibert.training.engine

    tok, ds = corpus
    releases = []
    monkeypatch.setattr(minibert.training.engine, "release_freed_memory",
                        lambda: releases.append(1))
    monkeypatch.setattr(minibert.training.engine, "RELEASE_EVERY", 2)
    cfg = train_config(max_steps=4, seq_len_warmup=2, seq_len_start=8, release_memory=release)
    train(tiny_model(tok), ds, collator(tok), cfg, tmp_path)
    assert bool(releases) == release
