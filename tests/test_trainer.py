"""transformers' Trainer with a minibert model: it trains (with gradient checkpointing on, as
`TrainingArguments(gradient_checkpointing=True)` asks), evaluates and predicts, each checked
against the model run by hand, and saves a folder that minibert and transformers both load
with the trained model's logits."""

import pytest
import torch

import minibert
from conftest import tiny_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # what transformers' Trainer runs on
pytest.importorskip("safetensors")


class Trainer(transformers.Trainer):
    """docs/research.md's: transformers' Trainer writes a whole folder (config.json, its
    parameter names) for its own PreTrainedModel alone; for any other model `save_model`
    writes the state dict. This one writes minibert's folder over it. Checkpoints during
    training (`_internal_call`) stay the state dict that Trainer resumes from."""

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if self.args.should_save and not _internal_call:
            self.model.save_pretrained(output_dir or self.args.output_dir)


def _dataset(n=12, T=8):
    """Rows of the same length (transformers' default collator stacks them as they are), the
    label a function of the first token, so three steps can learn something."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (n, T), generator=g)
    return [{"input_ids": row, "attention_mask": torch.ones(T, dtype=torch.long),
             "labels": torch.tensor(int(row[1] > 50))} for row in ids]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainer")
    torch.manual_seed(0)
    model = minibert.BertForSequenceClassification(tiny_config(), num_labels=2)
    before = [p.detach().clone() for p in model.parameters()]
    args = transformers.TrainingArguments(
        output_dir=str(out / "run"), max_steps=3, per_device_train_batch_size=4,
        per_device_eval_batch_size=4, learning_rate=1e-3, use_cpu=True, report_to=[],
        gradient_checkpointing=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
        seed=0)
    data = _dataset()
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    result = trainer.train()
    return trainer, model, before, result, data, out


def test_trainer_trains_with_gradient_checkpointing(trained):
    trainer, model, before, result, _, _ = trained
    assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))
    assert model.is_gradient_checkpointing
    assert all(not torch.equal(p, p0) for p, p0 in zip(model.parameters(), before))


def test_trainer_evaluates_and_predicts_what_the_model_computes(trained):
    trainer, model, _, _, data, _ = trained
    batch = {k: torch.stack([row[k] for row in data]) for k in data[0]}
    model.eval()
    with torch.no_grad():
        want = model(**batch)
        # Trainer's loss is the mean of its batches' means (4 rows each, equal weights).
        losses = [model(**{k: v[i:i + 4] for k, v in batch.items()}).loss for i in (0, 4, 8)]
    metrics = trainer.evaluate()
    assert abs(metrics["eval_loss"] - torch.stack(losses).mean().item()) <= 1e-5
    pred = trainer.predict(data)
    assert pred.predictions.shape == (12, 2)
    assert abs(pred.predictions - want.logits.numpy()).max() <= 1e-5
    assert (pred.label_ids == batch["labels"].numpy()).all()


def test_trainer_saves_a_folder_both_libraries_load(trained):
    trainer, model, _, _, data, out = trained
    trainer.save_model(str(out / "saved"))
    batch = {k: torch.stack([row[k] for row in data]) for k in ("input_ids", "attention_mask")}
    model.eval()
    with torch.no_grad():
        want = model(**batch).logits
        ours = minibert.BertForSequenceClassification.from_pretrained(out / "saved")(**batch)
        theirs = transformers.AutoModelForSequenceClassification.from_pretrained(
            out / "saved").eval()(**batch)
    assert (ours.logits - want).abs().max().item() <= 1e-5
    assert (theirs.logits - want).abs().max().item() <= 1e-5
    assert (out / "saved" / "training_args.bin").is_file()  # Trainer's own files stay
