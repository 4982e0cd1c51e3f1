"""The run's state and identity: the schedule's horizon, resume checks, the run folder, and
the failure paths that must not crash or mix runs. Each test compares against an
independent reference (an uninterrupted run, a fresh run) or a documented refusal."""

import dataclasses
import json
import shutil

import pytest
import torch

from engine_utils import collator, tiny_corpus, tiny_model, train_config
from facts import raises
from minibert.training.checkpoint import latest_checkpoint, load_checkpoint
from minibert.training.distributed import DistContext
from minibert.training.engine import TrainConfig, TrainState, train
from minibert.training.rng import rank_seed
from minibert.training.optim import build_optimizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _rows(out_dir):
    return [json.loads(line) for line in open(out_dir / "metrics.jsonl")]


def test_extending_a_run_keeps_its_schedule_bit_for_bit(corpus, tmp_path):
    """max_steps 4 with horizon 8, resumed to 8 == an uninterrupted run of 8 (fp32, CPU)."""
    tok, ds = corpus
    reference = tiny_model(tok, dropout=0.1)
    train(reference, ds, collator(tok), train_config(max_steps=8), tmp_path / "ref")

    train(tiny_model(tok, dropout=0.1), ds, collator(tok),
          train_config(max_steps=4, decay_steps=8), tmp_path / "run")
    extended = tiny_model(tok, seed=5, dropout=0.1)
    train(extended, ds, collator(tok), train_config(max_steps=8), tmp_path / "run", resume=True)
    assert [(r["step"], r["loss"], r["lr"]) for r in _rows(tmp_path / "run")] == \
        [(r["step"], r["loss"], r["lr"]) for r in _rows(tmp_path / "ref")]
    assert all(torch.equal(p, q) for p, q in zip(extended.parameters(), reference.parameters()))


def test_the_horizon_is_fixed_at_the_start_and_steps_past_it_run_at_min_lr(corpus, tmp_path,
                                                                            caplog):
    tok, ds = corpus
    cfg = train_config(max_steps=4, warmup=1, min_lr=1e-4)
    train(tiny_model(tok), ds, collator(tok), cfg, tmp_path)
    before = [r["lr"] for r in _rows(tmp_path)]
    assert before[-1] == pytest.approx(1e-4)  # step 4 is the horizon: min_lr
    with caplog.at_level("INFO", logger="minibert.training.run"):
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=7, warmup=1,
                                                               min_lr=1e-4),
              tmp_path, resume=True)
    lrs = [r["lr"] for r in _rows(tmp_path)]
    assert lrs[:4] == before and lrs[4:] == pytest.approx([1e-4] * 3)  # no jump back up
    assert sum("past the schedule's horizon" in m for m in caplog.messages) == 1
    # An explicit, different horizon is a different run.
    with raises(ValueError, "decay_steps", "4", "10") as info:  # the setting, then and now
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=9, warmup=1,
                                                               min_lr=1e-4, decay_steps=10),
              tmp_path, resume=True)
    assert info.value.diffs == [("decay_steps", "4", "10")]


def test_resume_refuses_other_data_naming_setting_and_values(corpus, tmp_path):
    tok, ds = corpus
    identity = {"--seq-len": 32, "--mask-prob": 0.15, "corpus": "abc"}
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2), tmp_path,
          data_identity=identity)
    with raises(ValueError, "--mask-prob", "0.15", "0.3") as info:
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=4), tmp_path,
              resume=True, data_identity={**identity, "--mask-prob": 0.3})
    assert info.value.diffs == [("--mask-prob", "0.15", "0.3")]
    with raises(ValueError, "corpus", "'abc'") as info:
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=4), tmp_path,
              resume=True, data_identity={"--seq-len": 32, "--mask-prob": 0.15})
    assert info.value.diffs == [("corpus", "'abc'", "not set")]
    result = train(tiny_model(tok), ds, collator(tok), train_config(max_steps=4), tmp_path,
                   resume=True, data_identity=identity)
    assert result["steps"] == 4


def test_the_state_is_one_object_in_the_checkpoint(corpus, tmp_path):
    tok, ds = corpus
    model = tiny_model(tok)
    train(model, ds, collator(tok), train_config(max_steps=3, batch_size=16), tmp_path)
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    state = TrainState(**saved["train_state"])
    # 300 documents pack into a few dozen blocks: 3 batches of 16 may cross an epoch.
    assert state.step == 3 and state.epoch * len(ds) // 16 * 16 + state.consumed == 48
    assert state.tokens_seen > 0 and state.skipped == state.bad_steps == 0
    assert saved["model_class"] == "BertForMaskedLM"


def test_one_module_writes_and_reads_a_checkpoints_keys(corpus, tmp_path):
    """state.py writes a checkpoint's content (`TrainState.state_dict`) and is the only module
    that reads it by key: resume, export and the checks ask `state.Saved`. Every key the
    engine writes is looked for in the package's code, as a subscript or a `.get`."""
    import ast
    from pathlib import Path

    import minibert

    tok, ds = corpus
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=3, batch_size=16), tmp_path)
    keys = set(load_checkpoint(latest_checkpoint(tmp_path / "checkpoints")))
    keys -= {"id2label"}  # also a key of transformers' config.json, which hf.py reads
    assert {"model", "train_state", "model_config", "data_identity", "rng"} <= keys
    package = Path(minibert.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "training" / "state.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                key = node.args[0].value
            if key in keys:
                found.append(f"{path.relative_to(package)}:{node.lineno} {key!r}")
    assert not found, found


def test_a_subclass_checkpoint_exports_as_its_minibert_class(corpus, tmp_path):
    """A run of a user's subclass records the minibert class export rebuilds (its own name
    was "not one of" the exportable classes)."""
    import minibert
    from minibert.interop.export import export_checkpoint

    class MyMaskedLM(minibert.BertForMaskedLM):
        pass

    tok, ds = corpus
    model = MyMaskedLM(tiny_model(tok).config)
    train(model, ds, collator(tok), train_config(max_steps=2), tmp_path / "run")
    train(model, ds, collator(tok), train_config(max_steps=3), tmp_path / "run", resume=True)
    # The checkpoint names the minibert class; a checkpoint of another class is refused.
    from minibert.training.state import SettingsMismatch, check_identity, run_identity

    now = {**run_identity(model, train_config(max_steps=3)), "data_identity": {}}
    assert now["model_class"] == "BertForMaskedLM"
    with pytest.raises(SettingsMismatch, match="model class"):
        check_identity({**now, "model_class": "BertForTokenClassification"}, now, tmp_path)
    export_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"), tmp_path / "out")
    loaded = minibert.BertForMaskedLM.from_pretrained(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values()))


def test_kill_after_logging_then_resume_logs_each_step_once(corpus, tmp_path):
    """A run killed after logging steps it never checkpointed: on resume those rows go."""
    tok, ds = corpus
    reference = tmp_path / "ref"
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=6), reference)
    run = tmp_path / "run"
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=6, save_every=3), run)
    shutil.rmtree(run / "checkpoints" / "step_00000006")  # as if killed before this save
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "lo')  # and mid-write
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=6, save_every=3), run,
          resume=True)
    steps = [r["step"] for r in _rows(run)]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in _rows(run)] == [r["loss"] for r in _rows(reference)]


def test_fp16_non_finite_loss_is_skipped_without_crashing(corpus, tmp_path, monkeypatch):
    """A NaN loss under fp16 (scaler path patched onto the CPU): skipped, and the next step
    runs. Before, the scaler was left mid-step and the next unscale_ raised."""
    import minibert.training.run

    monkeypatch.setattr(minibert.training.run, "resolve_precision",
                        lambda precision, device: "fp16")
    tok, ds = corpus
    model = tiny_model(tok)
    forward, calls = model.forward, {"n": 0}

    def forward_with_nan(*args, **kwargs):
        calls["n"] += 1
        out = forward(*args, **kwargs)
        return dataclasses.replace(out, loss=out.loss * float("nan")) if calls["n"] == 2 else out

    model.forward = forward_with_nan
    result = train(model, ds, collator(tok), train_config(max_steps=4), tmp_path)
    rows = _rows(tmp_path)
    assert result["steps"] == 4 and result["skipped_steps"] == 1
    assert [r["skipped"] for r in rows[:4]] == [0, 1, 1, 1]
    assert rows[3]["loss"] < rows[0]["loss"]


def test_a_fresh_start_into_a_used_folder_is_refused_unless_overwriting(corpus, tmp_path):
    tok, ds = corpus
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=6, save_every=2), tmp_path)
    # the folder, what the run there left, and the setting that replaces it
    with raises(FileExistsError, str(tmp_path), "checkpoints", "metrics.jsonl", "overwrite=True"):

        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2), tmp_path)
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2), tmp_path,
          overwrite=True)
    # The old run's later checkpoints are gone, so a resume continues the new run.
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000002"]
    assert [r["step"] for r in _rows(tmp_path)] == [1, 2]


def test_a_rank_without_saved_rng_state_gets_its_own_stream(corpus, tmp_path, monkeypatch):
    """Resuming on more ranks than the checkpoint had: rank 1 must not replay rank 0."""
    import minibert.training.resume as resume

    tok, ds = corpus
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2), tmp_path)
    draws = {}
    for rank in (0, 1):
        ctx = DistContext(rank=rank, world_size=2)
        model = tiny_model(tok)
        optimizer = build_optimizer(model, 1e-3)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        state = TrainState(optimizer=optimizer, scaler=scaler)
        resume.resume_run(model, state, train_config(max_steps=4), {},
                          tmp_path / "checkpoints", ctx)
        draws[rank] = torch.rand(8)
    assert not torch.equal(draws[0], draws[1])
    assert rank_seed(0, 1) != rank_seed(0, 2) != rank_seed(1, 1)


@pytest.mark.parametrize("field,value,message", [
    ("max_grad_norm", 0.0, "max_grad_norm"), ("max_grad_norm", -1.0, "max_grad_norm"),
    ("adam_eps", 0.0, "adam_eps"), ("decay_steps", 0, "decay_steps"),
    ("weight_decay", -0.1, "weight_decay"), ("peak_flops", 0.0, "peak_flops")])
def test_settings_that_would_train_nothing_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value})


def test_count_targets_knows_each_task_s_unit():
    from minibert.labels import count_targets

    assert count_targets({"labels": torch.tensor([[1, -100, 2], [-100, -100, 3]])}) == 3
    assert count_targets({"labels": torch.tensor([0, 1, 1])}) == 3
    assert count_targets({"start_positions": torch.tensor([4, 0]),
                          "end_positions": torch.tensor([6, 0])}) == 2


def test_an_evaluation_cannot_overwrite_the_run_s_own_keys(corpus, tmp_path):
    """An eval_fn returning "precision" (an F1 script's) would silently replace the dtype."""
    tok, ds = corpus
    with raises(ValueError, "eval_fn", "['precision']"):  # who said it, and the names refused
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2), tmp_path,
              eval_fn=lambda m, precision: {"precision": 0.5, "f1": 0.4})


def test_a_resumed_auto_run_keeps_the_precision_it_started_in(corpus, tmp_path, monkeypatch):
    """precision="auto" measures the machine; measured again on resume (a busy machine,
    another machine) it may come out otherwise. The run computes in the precision of its
    first start throughout, so the resumed run equals the uninterrupted one."""
    import minibert.training.run

    tok, ds = corpus
    today = {"auto": "bf16"}
    monkeypatch.setattr(minibert.training.run, "resolve_precision",
                        lambda p, device: today.get(p, p))
    cfg = train_config(precision="auto", max_steps=4)
    reference = train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "ref")
    train(tiny_model(tok), ds, collator(tok), train_config(precision="auto", max_steps=2,
                                                           decay_steps=4), tmp_path / "run")
    today["auto"] = "fp32"  # the probe says otherwise now
    resumed = train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "run", resume=True)
    assert reference["precision"] == resumed["precision"] == "bf16"
    assert [r["loss"] for r in _rows(tmp_path / "run")] == \
        [r["loss"] for r in _rows(tmp_path / "ref")]
    saved = load_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"))
    assert saved["train_state"]["precision"] == "bf16"


def test_resume_refuses_another_model_class_by_name(corpus, tmp_path):
    """The same config under another head is another run: refused before any weight loads."""
    import minibert

    tok, ds = corpus
    mlm = tiny_model(tok)
    train(mlm, ds, collator(tok), train_config(max_steps=2), tmp_path)
    other = minibert.BertForSequenceClassification(mlm.config, 2)
    with raises(ValueError, "'BertForMaskedLM'", "'BertForSequenceClassification'") as info:
        train(other, ds, collator(tok), train_config(max_steps=4), tmp_path, resume=True)
    assert info.value.diffs == [("model class", "'BertForMaskedLM'",
                                 "'BertForSequenceClassification'")]


def test_a_resume_this_device_cannot_compute_is_refused_before_anything_is_written(
        corpus, tmp_path):
    """A run that computes in fp16 (begun on a GPU) resumed on a CPU: `check_resume`, which
    the scripts call before they write, refuses it naming the precision. The engine found
    out only once the run held its folder, after loading the checkpoint."""
    from minibert.training.checkpoint import save_checkpoint
    from minibert.training.resume import RunPlan, check_resume

    tok, ds = corpus
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2), tmp_path)
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    saved["train_state"]["precision"] = "fp16"
    save_checkpoint(tmp_path / "checkpoints", 2, saved)
    plan = RunPlan(tiny_model(tok), train_config(max_steps=4), {}, tmp_path, resume=True)
    with pytest.raises(ValueError, match=f"the run in {tmp_path} computes in fp16"):
        check_resume(plan, torch.device("cpu"))
    plan.resume = False  # a fresh start has no checkpoint to answer to
    check_resume(plan, torch.device("cpu"))


def test_a_resume_may_stop_earlier_with_a_step_count_warmup(corpus, tmp_path):
    """max_steps may shrink on resume (the horizon is the run's): a warmup given in steps
    that is longer than the new max_steps is not refused, since the run's horizon holds it."""
    tok, ds = corpus
    reference = train(tiny_model(tok), ds, collator(tok),
                      train_config(max_steps=6, warmup=4), tmp_path / "ref")
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2, warmup=4,
                                                           decay_steps=6), tmp_path / "run")
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=3, warmup=4),
          tmp_path / "run", resume=True)  # stops before the warmup ends
    resumed = train(tiny_model(tok), ds, collator(tok), train_config(max_steps=6, warmup=4),
                    tmp_path / "run", resume=True)
    assert resumed["steps"] == reference["steps"] == 6
    assert [r["lr"] for r in _rows(tmp_path / "run")] == [r["lr"] for r in _rows(tmp_path / "ref")]
    # A fresh start still refuses a warmup longer than its schedule, before touching the folder.
    (tmp_path / "new").mkdir()
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2), tmp_path / "new")
    before = sorted(p.name for p in (tmp_path / "new" / "checkpoints").iterdir())
    with pytest.raises(ValueError, match="warmup"):
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2, warmup=3),
              tmp_path / "new", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "new" / "checkpoints").iterdir()) == before


def test_a_resume_past_max_steps_is_refused_and_a_finished_run_is_only_scored(corpus,
                                                                               tmp_path):
    """A run cannot go back: said before evaluating or logging anything. A finished run
    resumed (a script's later stage, resumed with its first) trains nothing, is scored again
    for its result, and logs nothing twice."""
    tok, ds = corpus
    metric = {"metric": 1.0}
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=4), tmp_path,
          eval_fn=lambda m, precision: metric)
    rows = (tmp_path / "metrics.jsonl").read_text()
    with raises(ValueError, "--resume", "step 4", "max_steps=2", "--max-steps"):

        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2, decay_steps=4),
              tmp_path, resume=True, eval_fn=lambda m, precision: metric)
    assert (tmp_path / "metrics.jsonl").read_text() == rows
    metric["metric"] = 2.0
    again = train(tiny_model(tok), ds, collator(tok), train_config(max_steps=4), tmp_path,
                  resume=True, eval_fn=lambda m, precision: metric)
    assert again["steps"] == 4 and again["steps_this_run"] == 0 and again["metric"] == 2.0
    assert not again["interrupted"]
    assert (tmp_path / "metrics.jsonl").read_text() == rows


def test_the_log_reader_skips_a_row_cut_short(tmp_path):
    """One reader for metrics.jsonl: a kill mid-write leaves half a row, which crashed the
    final-evaluation check and the divergence check that parsed the file themselves."""
    from minibert.training.runlog import read_rows

    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": null, "lr": 0.1}\n{"step": 2, "eval_loss": 3.0}\n'
                   '{"step": 3, "lo')
    assert read_rows(log) == [{"step": 1, "loss": None, "lr": 0.1},
                              {"step": 2, "eval_loss": 3.0}]
    assert read_rows(tmp_path / "none.jsonl") == []


def test_one_process_counts_a_batch_over_ranks_without_a_device_tensor(monkeypatch):
    """Reading a device tensor back waits for every kernel queued on a GPU, and the next
    step's batch is cut while this one's kernels run: in one process the counts the engine
    takes over ranks (the batch's targets, its widest sequence) stay plain integers."""
    from types import SimpleNamespace

    from minibert.data import GlobalBatches
    from minibert.training import distributed, engine
    from minibert.training.run import TrainData

    ids = torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]])
    labels = torch.tensor([[-100, 5, -100, -100], [-100, 7, -100, -100]])
    mask = (ids != 0).long()

    def no_tensor(*args, **kwargs):
        raise AssertionError("a tensor was made in one process")

    def collate(examples, epoch):
        return {"input_ids": ids[:len(examples)], "labels": labels[:len(examples)],
                "attention_mask": mask[:len(examples)]}

    data = TrainData(list(range(4)), collate, {}, batches=GlobalBatches(4, 2, seed=0))
    cfg = SimpleNamespace(batch=SimpleNamespace(seq_len_start=2),
                          process=SimpleNamespace(release_memory=False))
    run = SimpleNamespace(data=data, ctx=distributed.DistContext(), micro=1, seq_warmup=4,
                          cfg=cfg)
    monkeypatch.setattr(torch, "tensor", no_tensor)
    position, micros, counts, n_global = engine.global_batch(
        run, SimpleNamespace(micro_batch_size=None), 1)
    assert counts == [1, 1] and n_global == 2 and len(micros) == 2
    assert distributed.max_over_ranks(7, distributed.DistContext()) == 7
