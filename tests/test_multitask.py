"""BertMultiTask against the single-task classes on the same weights, its exports in
transformers, and examples/finetune_multitask.py end to end: outputs, resume, bad input."""

import json
import random

import pytest
import torch

import minibert
from conftest import hf_config, random_batch, tiny_config
from facts import raises
from engine_utils import load_example, quick_runs, torchrun  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

TAGS = ["O", "B-PER", "I-PER", "B-LOC"]
TASKS = {"mood": ("sequence", 3), "ner": ("token", TAGS)}


def _random_multitask(seed=0):
    model = minibert.BertMultiTask(tiny_config(), TASKS)
    torch.manual_seed(seed)
    with torch.no_grad():  # random values everywhere: a swapped or skipped tensor shows
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


def _reference(model, task):
    """The single-task class with the multi-task model's weights, copied by name alone."""
    kind, labels = TASKS[task]
    if kind == "sequence":
        ref = minibert.BertForSequenceClassification(tiny_config(), labels)
    else:
        ref = minibert.BertForTokenClassification(tiny_config(), len(labels), id2label=labels)
    sd = {k: t for k, t in model.state_dict().items()
          if not k.startswith("heads.") and k in {f"bert.{n}" for n in ref.bert.state_dict()}}
    sd.update({k.removeprefix(f"heads.{task}."): t for k, t in model.state_dict().items()
               if k.startswith(f"heads.{task}.")})
    ref.load_state_dict(sd)  # strict: every parameter of the reference is set
    return ref.eval()


def test_each_task_computes_what_its_single_task_model_computes():
    model = _random_multitask()
    ids, mask = random_batch(pad_from=20)
    g = torch.Generator().manual_seed(2)
    labels = {"mood": torch.randint(0, 3, (3,), generator=g),
              "ner": torch.randint(0, len(TAGS), ids.shape, generator=g)}
    labels["ner"][:, ::3] = -100
    with torch.no_grad():
        for task in TASKS:
            ref = _reference(model, task)
            a = model(ids, mask, labels=labels[task], task=task)
            b = ref(ids, mask, labels=labels[task])
            assert type(a) is type(b)
            assert torch.allclose(a.logits, b.logits, atol=1e-6, rtol=0)
            assert abs(a.loss.item() - b.loss.item()) < 1e-6
            assert model(ids, mask, task=task).loss is None
        # The heads differ: the token head's logits are not the sequence head's.
        assert model(ids, mask, task="ner").logits.shape == (3, ids.shape[1], len(TAGS))
    with raises(ValueError, "'pos'", "['mood', 'ner']"):  # the name, and the tasks there are
        model(ids, mask, task="pos")
    assert model.tasks == {"mood": ("sequence", ["LABEL_0", "LABEL_1", "LABEL_2"]),
                           "ner": ("token", TAGS)}
    with pytest.raises(ValueError, match="kind"):
        minibert.BertMultiTask(tiny_config(), {"x": ("regression", 1)})
    with raises(ValueError, "'a.b'", "letters, digits, '_' and '-'"):
        minibert.BertMultiTask(tiny_config(), {"a.b": ("sequence", 2)})
    with raises(ValueError, "'update'", "nn.ModuleDict"):
        minibert.BertMultiTask(tiny_config(), {"update": ("sequence", 2)})
    with pytest.raises(ValueError, match="num_labels"):
        minibert.BertMultiTask(tiny_config(), {"x": ("token", 1)})  # as the token class


def test_task_collator_names_the_task_a_batch_belongs_to():
    """BertMultiTask's batches carry their task from the library's collator, so a user's
    own multi-task loop needs no collator of its own."""
    from minibert.data import TaskCollator

    collate = TaskCollator(pad_id=0)
    ner = [{"input_ids": [2, 5, 3], "labels": [-100, 1, -100], "task": "ner"},
           {"input_ids": [2, 3], "labels": [-100, -100], "task": "ner"}]
    batch = collate(ner)
    assert batch["task"] == "ner" and batch["labels"].shape == (2, 3)
    assert "task" not in collate([{k: v for k, v in e.items() if k != "task"} for e in ner])
    with raises(ValueError, "one task", "['ner', 'pos']"):
        collate([ner[0], {**ner[1], "task": "pos"}])
    with raises(ValueError, "1 of 2", "'task'"):

        collate([ner[0], {k: v for k, v in ner[1].items() if k != "task"}])


def test_export_loads_in_transformers_and_minibert_with_the_same_logits(tmp_path):
    model = _random_multitask(seed=1)
    ids, mask = random_batch(pad_from=11)
    for task, cls in (("mood", "BertForSequenceClassification"),
                      ("ner", "BertForTokenClassification")):
        folder = model.export(task, tmp_path / task)
        theirs = getattr(transformers, cls).from_pretrained(folder).eval()
        ours = getattr(minibert, cls).from_pretrained(folder).eval()
        with torch.no_grad():
            want = model(ids, mask, task=task).logits
            got_hf = theirs(input_ids=ids, attention_mask=mask).logits
            got = ours(ids, mask).logits
        keep = mask.bool() if want.dim() == 3 else slice(None)  # real tokens only
        assert (want[keep] - got_hf[keep]).abs().max() < 1e-5
        assert torch.equal(want, got)
        names = [theirs.config.id2label[i] for i in range(len(theirs.config.id2label))]
        assert names == model.tasks[task][1] == ours.id2label


def test_from_pretrained_takes_the_encoder_and_starts_fresh_heads(tmp_path):
    theirs = transformers.BertForMaskedLM(hf_config(tiny_config()))
    theirs.save_pretrained(tmp_path)
    model = minibert.BertMultiTask.from_pretrained(tmp_path, TASKS, hidden_dropout=0.0).eval()
    ref = minibert.BertModel.from_pretrained(tmp_path, hidden_dropout=0.0).eval()
    ids, mask = random_batch(pad_from=9)
    with torch.no_grad():
        assert torch.equal(model.bert(ids, mask).last_hidden_state,
                           ref(ids, mask).last_hidden_state)
    assert model.config.hidden_dropout == 0.0


# ---- the example -----------------------------------------------------------------------------

script = load_example("finetune_multitask")
MOODS = {"neg": "awful", "neu": "okay", "pos": "great"}
FILLER = "the a film was and very it plot with actors today later story".split()




@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("multi")
    rng = random.Random(0)

    def review():
        label = rng.choice(sorted(MOODS))
        words = [rng.choice(FILLER) for _ in range(rng.randint(2, 6))]
        words.insert(rng.randrange(len(words) + 1), MOODS[label])
        return f"{' '.join(words)}\t{label}"

    def sentence():
        words = [(rng.choice(FILLER), "O") for _ in range(rng.randint(2, 6))]
        words.insert(rng.randrange(len(words) + 1), (rng.choice(["ann", "bob"]), "B-PER"))
        words.insert(rng.randrange(len(words) + 1), (rng.choice(["rome", "oslo"]), "B-LOC"))
        return "\n".join(f"{w} {t}" for w, t in words)

    for split, n in (("train", 64), ("dev", 12)):
        (d / f"{split}.tsv").write_text("text\tlabel\n" + "\n".join(review() for _ in
                                                                   range(n)) + "\n")
        (d / f"{split}.conll").write_text("\n\n".join(sentence() for _ in range(n // 2)) + "\n")
    return d


def _args(d, out, tasks=("mood", "ner"), *extra):
    specs = {"mood": f"mood:sequence:{d / 'train.tsv'}:{d / 'dev.tsv'}",
             "ner": f"ner:token:{d / 'train.conll'}:{d / 'dev.conll'}"}
    return [a for t in tasks for a in ("--task", specs[t])] + [
        "--text-column", "text", "--label-column", "label", "--out", str(out),
        "--cache-dir", str(d / "cache"), "--preset", "tiny", "--vocab-size", "120",
        "--seq-len", "16", "--batch-size", "8", "--lr", "2e-3", "--log-every", "2",
        "--no-progress", "--precision", "fp32", "--decay-steps", "48", *extra]


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """Four epoch-equivalents of 12 steps (96 training examples in batches of 8)."""
    out = tmp_path_factory.mktemp("run") / "out"
    assert script.main(_args(data, out, ("mood", "ner"), "--epochs", "4")) == 0
    return out


def test_trains_both_tasks_reports_each_and_exports_each(run, data):
    summary = json.loads((run / "eval.json").read_text())
    assert summary["steps"] == 48 and summary["precision"] == "fp32"
    mood, ner = summary["tasks"]["mood"], summary["tasks"]["ner"]
    assert mood["kind"] == "sequence" and mood["labels"] == ["neg", "neu", "pos"]
    assert 0 <= mood["accuracy"] <= 1 and 0 <= mood["f1"] <= 1 and mood["eval_examples"] == 12
    assert ner["kind"] == "token" and set(ner["per_type"]) <= {"PER", "LOC"}
    assert 0 <= ner["f1"] <= 1 and mood["train_examples"] == 64 and ner["train_examples"] == 32
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    evals = [r for r in rows if "mood/accuracy" in r]  # after each epoch-equivalent
    assert [r["step"] for r in evals] == [12, 24, 36, 48] and evals[-1]["ner/f1"] == ner["f1"]
    assert evals[-1]["mood/f1"] == mood["f1"] and "ner/eval_loss" in evals[0]
    # A keyword decides each label and names decide the tags: a working pipeline learns
    # both (chance is 1/3 for the moods); misaligned labels or a wrong head would not.
    assert mood["accuracy"] >= 0.8 and ner["f1"] >= 0.8
    assert evals[0]["mood/accuracy"] < mood["accuracy"]
    # final/<task> is that task's single-task model, with its labels and the tokenizer.
    tok = minibert.Tokenizer.from_pretrained(run / "final" / "mood")
    seq = minibert.BertForSequenceClassification.from_pretrained(run / "final" / "mood")
    tags = minibert.BertForTokenClassification.from_pretrained(run / "final" / "ner")
    assert seq.id2label == mood["labels"] and tags.id2label == ner["labels"]
    theirs = transformers.BertForTokenClassification.from_pretrained(run / "final" / "ner")
    ids = torch.tensor([tok.encode("ann saw the film in rome")])
    with torch.no_grad():
        assert (theirs(input_ids=ids).logits - tags.eval()(ids).logits).abs().max() < 1e-5
    # Both exports share one encoder: the token model's is the sequence model's, pooler aside.
    enc = {k: t for k, t in seq.bert.state_dict().items() if not k.startswith("pooler.")}
    assert all(torch.equal(t, tags.bert.state_dict()[k]) for k, t in enc.items())


def test_resume_continues_the_run_exactly_and_refuses_another_task_list(run, data, tmp_path,
                                                                       capsys):
    out = tmp_path / "out"
    assert script.main(_args(data, out, ("mood", "ner"), "--max-steps", "19")) == 0
    assert script.main(_args(data, out, ("mood", "ner"), "--max-steps", "48",
                             "--resume")) == 0
    for task, cls in (("mood", minibert.BertForSequenceClassification),
                      ("ner", minibert.BertForTokenClassification)):
        a, b = (cls.from_pretrained(r / "final" / task).state_dict() for r in (run, out))
        assert all(torch.equal(a[k], b[k]) for k in a), task
    before = (out / "metrics.jsonl").read_text()
    assert script.main(_args(data, out, ("ner",), "--max-steps", "50", "--resume")) == 2
    assert "tasks: checkpoint ['mood:sequence', 'ner:token'], now ['ner:token']" in \
        capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("spec,message", [
    ("mood:sequence:{d}/train.tsv", "does not parse; expected name:kind:train:eval"),
    ("mood:regression:{d}/train.tsv:{d}/dev.tsv", "unknown kind 'regression'"),
    ("mood:sequence:{d}/missing.tsv:{d}/dev.tsv", "missing.tsv not found"),
    ("ner:sequence:{d}/train.tsv:{d}/dev.tsv", "'ner' is used twice"),
    ("a/b:token:{d}/train.conll:{d}/dev.conll", "may hold only letters"),
    ("keys:token:{d}/train.conll:{d}/dev.conll", "'keys' is taken by nn.ModuleDict"),
])
def test_bad_task_specs_are_one_line_and_write_nothing(spec, message, data, tmp_path, capsys):
    out = tmp_path / "out"
    args = _args(data, out, ("ner",))
    args[2:2] = ["--task", spec.format(d=data)]
    assert script.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()


def test_two_processes_train_the_tasks_as_one_does(data, tmp_path):
    """Under torchrun each step leaves the other tasks' heads without gradients; DDP must
    accept that (it raised at the second step before). The same batches and tasks are
    trained without dropout (each rank would draw its own masks), so the losses agree up
    to the order of summation."""
    from pathlib import Path

    script_path = Path(__file__).resolve().parents[1] / "examples" / "finetune_multitask.py"
    steps = ("--max-steps", "6", "--log-every", "1", "--decay-steps", "6", "--dropout", "0")
    one = tmp_path / "one"
    assert script.main(_args(data, one, ("mood", "ner"), *steps)) == 0
    two = tmp_path / "two"
    torchrun(script_path, [*_args(data, two, ("mood", "ner"), *steps, "--device", "cpu")],
             tmp_path / "logs")

    def losses(out):
        return [r["loss"] for r in map(json.loads, open(out / "metrics.jsonl")) if "loss" in r]

    assert len(losses(one)) == len(losses(two)) == 6
    assert losses(two) == pytest.approx(losses(one), rel=1e-4)
