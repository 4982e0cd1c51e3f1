"""minibert.tasks.distill: the loss against a hand computation and the frozen teacher; and
examples/distill.py, the CLI, end to end."""

import copy
import json
import math
import shutil

import numpy as np
import pytest
import torch

import minibert
import minibert.machine.meters
from minibert.training.checkpoint import latest_checkpoint, load_checkpoint
from minibert.data import MLMCollator
from minibert.tasks.distill import Distiller, distillation_loss
from minibert.training.engine import TrainConfig, train
from minibert.interop.hf import model_type
from minibert.training.optim import build_optimizer

from engine_utils import load_example, step_clock, weights_file, wikitext_folder
from facts import assert_carries, raises

distill = load_example("distill")


@pytest.fixture(autouse=True)
def _no_flops_measurement(monkeypatch):
    # The first run on a machine times matmuls for its MFU ceiling; a constant keeps it fast.
    monkeypatch.setattr(minibert.machine.meters, "measure_peak_flops", lambda *a, **k: 1e11)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return wikitext_folder(tmp_path_factory.mktemp("wikitext"), (("train", 60), ("valid", 10)))


@pytest.fixture(scope="module")
def tok(data_dir, tmp_path_factory):
    texts = (data_dir / "train.txt").read_text().split("\n")
    return minibert.Tokenizer.train_from_iterator(
        texts, vocab_size=120, cache_dir=tmp_path_factory.mktemp("tokcache"))


@pytest.fixture(scope="module")
def teacher_dir(tok, tmp_path_factory):
    """A random-weight 'mini' teacher saved as a checkpoint folder with its tokenizer."""
    d = tmp_path_factory.mktemp("teacher")
    torch.manual_seed(1)
    config = minibert.BertConfig.preset("mini", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                                        max_position_embeddings=64)
    minibert.BertForMaskedLM(config).save_pretrained(d)
    tok.save(d)
    return d


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # token files, shared by the runs below


# ---- the loss --------------------------------------------------------------------------------

def _softmax(row, T):
    m = max(row)
    e = [math.exp((x - m) / T) for x in row]
    return [x / sum(e) for x in e]


def test_loss_matches_a_hand_computation():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5, generator=g, dtype=torch.float64) * 2  # (N, V)
    t = torch.randn(3, 5, generator=g, dtype=torch.float64) * 2
    y = torch.tensor([4, 0, 2])
    for alpha, T in ((0.5, 2.0), (1.0, 1.0), (0.0, 3.0), (0.3, 0.5)):
        kl = ce = 0.0
        for i in range(3):
            ps, pt = _softmax(s[i].tolist(), T), _softmax(t[i].tolist(), T)
            kl += sum(b * (math.log(b) - math.log(a)) for a, b in zip(ps, pt))
            ce -= math.log(_softmax(s[i].tolist(), 1.0)[int(y[i])])
        expected = alpha * T * T * kl / 3 + (1 - alpha) * ce / 3
        got = distillation_loss(s, t, y, alpha, T)
        assert got.item() == pytest.approx(expected, rel=1e-6, abs=1e-7), (alpha, T)


def test_soft_gradient_is_t_times_the_probability_gap():
    # Hinton et al. 2015, eq. 2: d(T^2 KL)/dz_student = T (q_student - p_teacher), per token.
    g = torch.Generator().manual_seed(1)
    s = torch.randn(4, 7, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(4, 7, generator=g, dtype=torch.float64)
    T = 3.0
    distillation_loss(s, t, torch.zeros(4, dtype=torch.long), 1.0, T).backward()
    gap = torch.softmax(s.detach() / T, -1) - torch.softmax(t / T, -1)
    torch.testing.assert_close(s.grad, T * gap / 4)


def _models(vocab=50, seed=0):
    torch.manual_seed(seed)
    student = minibert.BertForMaskedLM(minibert.BertConfig.preset("tiny", vocab_size=vocab))
    teacher = minibert.BertForMaskedLM(minibert.BertConfig.preset("mini", vocab_size=vocab))
    return student, teacher


def _batch(vocab=50, B=3, T=12):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, 2::4] = ids[:, 2::4]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids), "labels": labels}


def test_alpha_zero_is_the_plain_mlm_loss_and_a_copied_teacher_costs_nothing():
    student, teacher = _models()
    student.eval()
    batch = _batch()
    plain = student(**batch)
    out = Distiller(student, teacher, alpha=0.0, temperature=2.0)(**batch)
    assert torch.equal(out.loss, plain.loss) and torch.equal(out.logits, plain.logits)
    assert out.logits.shape == (int((batch["labels"] != -100).sum()), 50)
    mixed = Distiller(student, teacher, alpha=0.5, temperature=2.0)(**batch).loss
    assert not torch.isclose(mixed, plain.loss)
    # A teacher identical to the student: KL is 0, so alpha=1 gives 0 and alpha=0.5 half CE.
    twin = copy.deepcopy(student)
    assert Distiller(student, twin, alpha=1.0, temperature=4.0)(**batch).loss.abs() < 1e-6
    half = Distiller(student, twin, alpha=0.5, temperature=4.0)(**batch).loss
    torch.testing.assert_close(half, plain.loss / 2)
    # Without labels: the student's own (B, T, V) logits.
    no_labels = {k: v for k, v in batch.items() if k != "labels"}
    assert Distiller(student, teacher)(**no_labels).logits.shape == (3, 12, 50)


def test_bf16_autocast_keeps_the_loss_in_fp32():
    student, teacher = _models()
    student.eval()  # no dropout: the fp32 loss below is the same computation
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = Distiller(student, teacher)(**_batch())
    assert out.logits.dtype == torch.bfloat16
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    fp32 = Distiller(student, teacher)(**_batch()).loss  # the same loss, to bf16's rounding
    torch.testing.assert_close(out.loss, fp32, rtol=5e-3, atol=0.0)



def test_bad_settings_are_refused_by_the_module():
    student, teacher = _models()
    with raises(ValueError, "student", "50", "teacher", "60"):  # both vocabulary sizes

        Distiller(student, _models(vocab=60)[1])
    for alpha, T, words in ((1.5, 2.0, "--alpha"), (-0.1, 2.0, "--alpha"),
                            (float("nan"), 2.0, "--alpha"), (0.5, 0.0, "--temperature"),
                            (0.5, float("inf"), "--temperature")):
        with pytest.raises(ValueError, match=words):
            Distiller(student, teacher, alpha, T)


def test_gradients_reach_the_student_only(tok, tmp_path):
    rng = np.random.default_rng(0)
    ordinary = [i for i in range(tok.vocab_size) if i not in tok.special_ids]
    examples = [{"input_ids": np.array([tok.cls_id, *rng.choice(ordinary, 14), tok.sep_id]),
                 "index": i} for i in range(16)]
    student, teacher = _models(vocab=tok.vocab_size)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = {k: v.clone() for k, v in student.state_dict().items()}
    model = Distiller(student, teacher, alpha=0.7, temperature=2.0)
    trainable = {id(p) for p in student.parameters()}
    grouped = [p for g in build_optimizer(model, 1e-3).param_groups for p in g["params"]]
    assert {id(p) for p in grouped} == trainable  # every student parameter, nothing else

    cfg = TrainConfig(batch_size=8, micro_batch_size=4, max_steps=3, lr=1e-2, warmup=0,
                      precision="fp32", progress=False)
    train(model, examples, MLMCollator(tok, seed=0), cfg, tmp_path, eval_set=examples)
    assert not teacher.training and all(not p.requires_grad and p.grad is None
                                        for p in teacher.parameters())
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    assert any(not torch.equal(v, student_before[k]) for k, v in student.state_dict().items())
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert set(state["model"]) == {f"student.{k}" for k in student.state_dict()}
    n_saved = sum(len(g["params"]) for g in state["optimizer"]["param_groups"])
    assert n_saved == len(trainable)
    assert state["model_config"]["hidden_size"] == student.config.hidden_size


# ---- the script ------------------------------------------------------------------------------

def _args(data_dir, teacher_dir, out, cache, *extra):
    return ["--teacher", str(teacher_dir), "--data-dir", str(data_dir), "--out", str(out),
            "--cache-dir", str(cache), "--seq-len", "32", "--batch-size", "8",
            "--max-steps", "4", "--eval-batches", "2", "--log-every", "2", "--no-progress",
            "--precision", "fp32",
            *extra]


def _timeless(rows):
    return {k: {f: v for f, v in r.items() if f != "wall_seconds"} for k, r in rows.items()}


def test_evaluation_masks_at_eval_mask_prob_like_the_main_job(data_dir, teacher_dir, cache,
                                                              tmp_path, monkeypatch):
    """Every row (teacher, distilled, baseline) is scored at --eval-mask-prob, 15% unless
    set, whatever --mask-prob trains at: the main job's eval losses compare with these."""
    rates = []
    real = distill.eval_batches

    def spy(eval_set, collate, *args):
        rates.append(collate.mlm_probability)
        return real(eval_set, collate, *args)

    monkeypatch.setattr(distill, "eval_batches", spy)
    assert distill.main(_args(data_dir, teacher_dir, tmp_path / "run", cache,
                              "--mask-prob", "0.4", "--eval-mask-prob", "0.2")) == 0
    assert rates and set(rates) == {0.2}


def test_end_to_end_three_rows_and_exact_resume(data_dir, teacher_dir, cache, tmp_path, capsys):
    out = tmp_path / "run"
    assert distill.main(_args(data_dir, teacher_dir, out, cache, "--save-every", "2")) == 0
    rows = json.loads((out / "eval.json").read_text())
    assert set(rows) == {"teacher", "distilled", "baseline"}
    for r in rows.values():
        assert {"model", "parameters", "eval_loss", "eval_accuracy", "perplexity"} <= set(r)
        assert math.isfinite(r["eval_loss"]) and 0 <= r["eval_accuracy"] <= 1
    assert rows["distilled"]["steps"] == rows["baseline"]["steps"] == 4
    assert rows["distilled"]["parameters"] < rows["teacher"]["parameters"]
    assert rows["distilled"]["eval_loss"] != rows["baseline"]["eval_loss"]
    assert "| teacher (" in capsys.readouterr().out
    student = minibert.BertForMaskedLM.from_pretrained(out / "final")
    teacher_tok = minibert.Tokenizer.from_pretrained(teacher_dir)
    assert minibert.Tokenizer.from_pretrained(out / "final").fingerprint == teacher_tok.fingerprint
    assert student.config.hidden_size == 128  # the tiny preset
    assert (out / "baseline" / "checkpoints" / "step_00000004").is_dir()
    assert not (out / "checkpoints" / "step_00000004" / "teacher").exists()
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForMaskedLM.from_pretrained(out / "final")
    assert hf.config.vocab_size == teacher_tok.vocab_size
    capsys.readouterr()  # transformers' loading progress bar, on stderr

    # Lose the last checkpoint of the distillation; --resume recomputes the same numbers.
    shutil.rmtree(out / "checkpoints" / "step_00000004")
    assert distill.main(_args(data_dir, teacher_dir, out, cache, "--resume")) == 0
    assert _timeless(json.loads((out / "eval.json").read_text())) == _timeless(rows)
    # The baseline stopped before its first checkpoint, its log written: it starts over (it
    # was refused both as a fresh start and as a resume, and --resume could never finish).
    shutil.rmtree(out / "baseline" / "checkpoints")
    (out / "baseline" / "checkpoints" / ".tmp-step_00000002").mkdir(parents=True)  # killed
    assert distill.main(_args(data_dir, teacher_dir, out, cache, "--resume")) == 0
    assert _timeless(json.loads((out / "eval.json").read_text())) == _timeless(rows)
    # Its checkpoints there but all damaged: refused, and nothing is deleted.
    for state in (out / "baseline" / "checkpoints").glob("step_*/*"):
        if state.is_file():
            state.write_bytes(b"damaged")
    assert_carries(_error_line(capsys, _args(data_dir, teacher_dir, out, cache, "--resume")),
                   "--resume", str(out / "baseline" / "checkpoints"))
    assert any((out / "baseline" / "checkpoints").iterdir())
    err = _error_line(capsys, _args(data_dir, teacher_dir, out, cache, "--resume",
                                    "--alpha", "0.3"))
    assert_carries(err, "--alpha", "0.5", "0.3")  # the flag, then and now


def test_alpha_zero_run_is_the_run_without_teacher(data_dir, teacher_dir, cache, tmp_path,
                                                   allocator_calls):
    out = tmp_path / "run"
    assert distill.main(_args(data_dir, teacher_dir, out, cache, "--alpha", "0",
                              "--max-steps", "3", "--keep-freed-memory")) == 0
    assert allocator_calls == [True]
    rows = json.loads((out / "eval.json").read_text())
    assert rows["distilled"]["eval_loss"] == rows["baseline"]["eval_loss"]
    assert rows["distilled"]["eval_accuracy"] == rows["baseline"]["eval_accuracy"]


def _error_line(capsys, argv):
    code = distill.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


def test_the_student_keeps_its_presets_switches_unless_a_flag_sets_one(data_dir, teacher_dir,
                                                                      cache, tmp_path):
    """A modernbert-* student was built Post-LN (the old --norm default), a model neither
    ModernBERT nor BERT that transformers could not load."""
    from minibert.tasks.distill import load_teacher

    teacher, tok = load_teacher(teacher_dir, 32)

    def student(*extra):
        argv = _args(data_dir, teacher_dir, tmp_path / "o", cache, *extra)
        return distill.student_config(distill.parse_args(argv), teacher, tok)

    modern = student("--student-preset", "modernbert-tiny")
    assert modern.norm_position == "pre" and model_type(modern) == "modernbert"
    assert model_type(student("--student-preset", "tiny")) == "bert"
    mixed = student("--student-preset", "tiny", "--norm", "pre", "--position", "rope")
    assert (mixed.norm_position, mixed.position, mixed.mlp) == ("pre", "rope", "gelu")
    assert modern.vocab_size == teacher.config.vocab_size and modern.pad_token_id == tok.pad_id


def test_bad_input_gets_one_line(data_dir, teacher_dir, cache, tmp_path, capsys):
    out = tmp_path / "run"

    def args(*extra, teacher=teacher_dir, out=out):
        return _args(data_dir, teacher, out, cache, *extra)

    cases = [  # (the command, the facts its one line must carry: the flag, the value, ...)
        (args(teacher=tmp_path / "nowhere"), ["--teacher", str(tmp_path / "nowhere")]),
        (args("--alpha", "1.5"), ["--alpha 1.5", "[0, 1]"]),
        (args("--alpha", "-0.2"), ["--alpha -0.2", "[0, 1]"]),
        (args("--temperature", "0"), ["--temperature 0.0", "> 0"]),
        (args("--temperature", "-1"), ["--temperature -1.0", "> 0"]),
        (args("--student-preset", "huge"), ["--student-preset", "'huge'", "tiny"]),
        (args("--seq-len", "100"), ["100", "teacher", "max_position_embeddings=64"]),
        (args("--micro-batch-size", "3"), ["--batch-size 8", "--micro-batch-size 3"]),
        (args("--max-grad-norm", "-1"), ["--max-grad-norm -1.0", "> 0"]),
        (args("--resume"), ["--resume", str(out)]),
        (args("--precision", "fp16"), ["--precision fp16", "CUDA"]),
        (args("--global-every", "0"), ["--global-every 0", ">= 1"]),
    ]
    for argv, facts in cases:
        assert_carries(_error_line(capsys, argv), *facts)

    # A teacher folder whose tokenizer is not the teacher's (more tokens than embeddings).
    odd = tmp_path / "odd_teacher"
    shutil.copytree(teacher_dir, odd)
    texts = (data_dir / "train.txt").read_text().split("\n")
    other = minibert.Tokenizer.train_from_iterator(texts, vocab_size=160, use_cache=False)
    other.save(odd)
    teacher_tok = minibert.Tokenizer.from_pretrained(teacher_dir)
    assert other.vocab_size > teacher_tok.vocab_size
    assert_carries(_error_line(capsys, args(teacher=odd)),  # both sizes, and whose is whose
                   f"{other.vocab_size} tokens", "teacher", f"{teacher_tok.vocab_size}")
    # An --out whose cached tokenizer is another vocabulary than the teacher's.
    other.save(out / "tokenizer")
    assert_carries(_error_line(capsys, args()), str(out / "tokenizer"), other.fingerprint[:16],
                   teacher_tok.fingerprint[:16], "--out")
    # A classifier as teacher: it has no MLM head to distil from.
    classifier = tmp_path / "classifier_teacher"
    minibert.BertForSequenceClassification(
        minibert.BertModel.from_pretrained(teacher_dir).config, 3).save_pretrained(classifier)
    minibert.Tokenizer.from_pretrained(teacher_dir).save(classifier)
    err = _error_line(capsys, args(teacher=classifier, out=tmp_path / "c"))
    assert_carries(err, str(classifier), "BertForSequenceClassification", "ForMaskedLM")
    # A teacher whose weights were cut short by a bad copy.
    cut = tmp_path / "cut_teacher"
    shutil.copytree(teacher_dir, cut)
    weights = next(cut.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:4000])
    assert_carries(_error_line(capsys, args(teacher=cut, out=tmp_path / "d")), str(weights),
                   "damaged")
    # --device cuda where there is none: one line, not a traceback.
    if not torch.cuda.is_available():
        assert "--device cuda" in _error_line(capsys, args("--device", "cuda"))
    # A teacher folder without weights.
    empty = tmp_path / "empty_teacher"
    empty.mkdir()
    assert_carries(_error_line(capsys, args(teacher=empty)), str(empty / "config.json"))



# ---- a compute budget ------------------------------------------------------------------------

def _budget_args(data_dir, teacher_dir, out, cache, *extra):
    """The script's flags without --max-steps, which --time-budget replaces."""
    argv = _args(data_dir, teacher_dir, out, cache, *extra)
    at = argv.index("--max-steps")
    return argv[:at] + argv[at + 2:]


@pytest.fixture
def one_second_steps(monkeypatch):
    """Every timed step and evaluation batch takes 1 s: 23.2 s of budget less 5% then fits 20
    steps and the final evaluation of 2 batches (test_budget.py)."""
    return step_clock(monkeypatch, 1.0)


def test_a_time_budget_fits_the_distillation_and_the_baseline_takes_its_steps(
        data_dir, teacher_dir, cache, tmp_path, one_second_steps, caplog):
    import logging
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        assert distill.main(_budget_args(data_dir, teacher_dir, out, cache,
                                         "--time-budget", "23.2s", "--dropout", "0.1")) == 0
    assert one_second_steps  # measured
    said = " ".join(r.getMessage() for r in caplog.records)
    assert_carries(said, "--time-budget 23.2s", "20 steps", "--max-steps 20")
    rows = json.loads((out / "eval.json").read_text())
    assert rows["distilled"]["steps"] == rows["baseline"]["steps"] == 20
    for run in (out, out / "baseline"):
        saved = load_checkpoint(latest_checkpoint(run / "checkpoints"))
        assert saved["train_config"]["max_steps"] == saved["train_config"]["decay_steps"] == 20
        assert saved["data_identity"]["--time-budget"] == {"seconds": 23.2, "steps": 20}
    # The budget's 20 steps are the run of --max-steps 20, bit for bit.
    steps = tmp_path / "steps"
    argv = _budget_args(data_dir, teacher_dir, steps, cache, "--max-steps", "20",
                        "--dropout", "0.1")
    assert distill.main(argv) == 0
    for name in (weights_file(out / "final").name, "config.json"):
        assert (out / "final" / name).read_bytes() == (steps / "final" / name).read_bytes()


def test_a_budget_run_resumed_keeps_its_steps_and_refuses_another_budget(
        data_dir, teacher_dir, cache, tmp_path, one_second_steps, capsys):
    out = tmp_path / "run"
    flags = ["--time-budget", "23.2s", "--save-every", "10"]
    assert distill.main(_budget_args(data_dir, teacher_dir, out, cache, *flags)) == 0
    rows = json.loads((out / "eval.json").read_text())
    # Stopped after the baseline's checkpoint at step 10: it goes on to the same 20 steps.
    shutil.rmtree(out / "baseline" / "checkpoints" / "step_00000020")
    (out / "eval.json").unlink()
    one_second_steps.clear()
    assert distill.main(_budget_args(data_dir, teacher_dir, out, cache, *flags,
                                     "--resume")) == 0
    assert not one_second_steps  # nothing measured again
    assert _timeless(json.loads((out / "eval.json").read_text())) == _timeless(rows)
    for extra, facts in [(["--time-budget", "1h"], ["--time-budget", "23.2", "3600"]),
                         ([], ["--time-budget", "not set"])]:
        err = _error_line(capsys, _budget_args(data_dir, teacher_dir, out, cache, "--resume",
                                               "--save-every", "10", *extra))
        assert_carries(err, *facts)


def test_a_budget_with_a_step_count_is_refused_before_anything_is_written(
        data_dir, teacher_dir, cache, tmp_path, one_second_steps, capsys):
    out = tmp_path / "run"
    for extra, facts in [(["--max-steps", "6"], ["--time-budget", "--max-steps"]),
                         (["--decay-steps", "6"], ["--time-budget", "--decay-steps"]),
                         ([], ["--time-budget 2s", "one step"])]:  # measured, then refused
        argv = _budget_args(data_dir, teacher_dir, out, cache, "--time-budget", "2s", *extra)
        assert_carries(_error_line(capsys, argv), *facts)
        assert not out.exists(), extra


def test_the_plan_times_an_evaluation_of_the_student_alone(data_dir, teacher_dir, cache,
                                                          tmp_path, monkeypatch):
    """The run's evaluations score the student without its teacher, so the plan's timed
    evaluation batch does too: the distiller (student and teacher) runs only to train."""
    modes = []
    real = Distiller.forward

    def spy(self, *args, **kwargs):
        modes.append(self.training)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Distiller, "forward", spy)
    assert distill.main(_args(data_dir, teacher_dir, tmp_path / "run", cache)) == 0
    assert modes and all(modes)
