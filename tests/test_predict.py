"""minibert.tasks.predict against the model run on each example alone: outputs, order, loss,
mode."""

import random

import pytest
import torch
import torch.nn.functional as F

import minibert
from minibert.data import IGNORE_INDEX, TaskCollator
from minibert.tasks.predict import predict
from conftest import tiny_config
from facts import raises

PAD = 0


def _examples(kind, n=11, seed=0):
    """Encoded examples of lengths 3..20, in no length order, with the kind's targets."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        T = rng.randint(3, 20)
        ex = {"input_ids": [2] + [rng.randint(5, 98) for _ in range(T - 2)] + [3],
              "token_type_ids": [0] * (T // 2) + [1] * (T - T // 2)}
        if kind == "sequence":
            ex["label"] = rng.randrange(3)
        elif kind == "token":  # some positions carry no label, as a word's later pieces
            ex["labels"] = [rng.randrange(4) if rng.random() < 0.6 else IGNORE_INDEX
                            for _ in range(T)]
            ex["labels"][1] = rng.randrange(4)  # every example holds a target
        else:
            s = rng.randrange(T)
            ex["start_position"], ex["end_position"] = s, rng.randrange(s, T)
        out.append(ex)
    return out


def _model(kind, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    config = tiny_config(hidden_dropout=dropout, attention_dropout=dropout)
    if kind == "sequence":
        return minibert.BertForSequenceClassification(config, 3)
    if kind == "token":
        return minibert.BertForTokenClassification(config, 4)
    return minibert.BertForQuestionAnswering(config)


@torch.no_grad()
def _alone(model, ex):
    """The model on one example, unpadded: no batch to depend on."""
    x = torch.tensor([ex["input_ids"]])
    return model(x, torch.ones_like(x), torch.tensor([ex["token_type_ids"]]))


@pytest.mark.parametrize("kind", ["sequence", "token", "qa"])
def test_outputs_equal_each_example_run_alone_in_input_order(kind):
    model, examples = _model(kind).eval(), _examples(kind)
    pred = predict(model, examples, TaskCollator(PAD), batch_size=4)
    fields = {"sequence": ["logits"], "token": ["logits"],
              "qa": ["start_logits", "end_logits"]}[kind]
    assert sorted(pred.outputs) == sorted(fields)
    for i, ex in enumerate(examples):
        alone = _alone(model, ex)
        for field in fields:
            want = getattr(alone, field)[0]  # (C,), (T, C) or (T,)
            got = pred.outputs[field][i]
            assert got.shape == want.shape and got.dtype == torch.float32
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The batch size decides only which examples share a batch, never an output.
    again = predict(model, examples, TaskCollator(PAD), batch_size=1)
    for field in fields:
        for a, b in zip(pred.outputs[field], again.outputs[field]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if kind != "qa":
        assert [int(p.argmax()) if p.dim() == 1 else p.argmax(-1).tolist()
                for p in pred.outputs["logits"]] == \
            [x.tolist() for x in pred.argmax()]


def test_mean_loss_is_over_every_target_of_the_set():
    # Token classification: the mean cross-entropy over all labelled tokens, so an example
    # with many labels weighs more than one with few (not a mean of batch means).
    model, examples = _model("token").eval(), _examples("token", n=13, seed=1)
    total, count = 0.0, 0
    for ex in examples:
        logits = _alone(model, ex).logits[0]  # (T, C)
        labels = torch.tensor(ex["labels"])
        keep = labels != IGNORE_INDEX
        total += float(F.cross_entropy(logits[keep], labels[keep], reduction="sum"))
        count += int(keep.sum())
    assert predict(model, examples, TaskCollator(PAD), 5).loss == pytest.approx(total / count,
                                                                               rel=1e-5)
    # Sequence classification: the mean over examples, whatever the last batch's size.
    model, examples = _model("sequence").eval(), _examples("sequence", n=10)
    by_hand = sum(float(F.cross_entropy(_alone(model, ex).logits, torch.tensor([ex["label"]])))
                  for ex in examples) / len(examples)
    assert predict(model, examples, TaskCollator(PAD), 4).loss == pytest.approx(by_hand,
                                                                              rel=1e-5)
    # Question answering: (start loss + end loss) / 2, averaged over the examples.
    model, examples = _model("qa").eval(), _examples("qa")
    by_hand = 0.0
    for ex in examples:
        out = _alone(model, ex)
        by_hand += float(F.cross_entropy(out.start_logits, torch.tensor([ex["start_position"]]))
                         + F.cross_entropy(out.end_logits, torch.tensor([ex["end_position"]])))
    assert predict(model, examples, TaskCollator(PAD), 3).loss == pytest.approx(
        by_hand / 2 / len(examples), rel=1e-5)
    # Without targets there is no loss.
    bare = [{"input_ids": ex["input_ids"]} for ex in examples]
    assert predict(model, bare, TaskCollator(PAD), 3).loss is None


def test_runs_in_eval_mode_and_restores_the_training_mode():
    model, examples = _model("sequence", dropout=0.5), _examples("sequence")
    model.train()
    first = predict(model, examples, TaskCollator(PAD), 4)
    assert model.training and all(m.training for m in model.modules())
    model.eval()  # dropout off: the reference, and what predict must have used above
    reference = predict(model, examples, TaskCollator(PAD), 4)
    assert not model.training and not any(m.training for m in model.modules())
    for a, b in zip(first.outputs["logits"], reference.outputs["logits"]):
        assert torch.equal(a, b)
    assert first.loss == reference.loss


def test_other_collated_values_pass_through_to_the_model():
    # A multi-task model takes the batch's task name, a string, beside the tensors.
    model = minibert.BertMultiTask(tiny_config(), {"mood": ("sequence", 3),
                                                    "ner": ("token", 4)}).eval()
    examples = _examples("token")

    def collate(batch):
        return {**TaskCollator(PAD)(batch), "task": "ner"}

    pred = predict(model, examples, collate, 4, precision="bf16")
    assert [p.shape for p in pred.outputs["logits"]] == \
        [(len(ex["input_ids"]), 4) for ex in examples]
    assert pred.outputs["logits"][0].dtype == torch.float32 and pred.loss > 0
    # the ner head's logits of each example, run alone in fp32, to bf16's rounding
    for got, ex in zip(pred.outputs["logits"], examples):
        x = torch.tensor([ex["input_ids"]])
        with torch.no_grad():
            want = model(x, torch.ones_like(x), torch.tensor([ex["token_type_ids"]]),
                         task="ner").logits[0]
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)



def test_refuses_outputs_that_are_not_one_row_per_example():
    model = minibert.BertForMaskedLM(tiny_config()).eval()
    # Three masked tokens in two examples: MLM logits are (3, V), rows of tokens.
    examples = [{"input_ids": [2, 7, 8, 3], "labels": [IGNORE_INDEX, 7, 8, IGNORE_INDEX]},
                {"input_ids": [2, 9, 3], "labels": [IGNORE_INDEX, 9, IGNORE_INDEX]}]
    with raises(ValueError, "logits", "3 rows", "2 examples"):  # MLM logits: a row per token

        predict(model, examples, TaskCollator(PAD), 2)
