"""Sequence-length warmup: the schedule, the cut, and a training run that follows it exactly
(its first step against the loss of a batch cut by hand, resume against an uninterrupted
run, and checkpoints from before the setting existed)."""

import json

import pytest
import torch

import minibert
from engine_utils import collator, tiny_corpus, tiny_model, train_config
from facts import raises
from minibert.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from minibert.data.sampler import GlobalBatches
from minibert.data.seq_warmup import cut_for_step, seq_len_at, truncate
from minibert.training.engine import TrainConfig, train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus"))  # blocks of 32 tokens


def test_the_schedule_grows_linearly_in_multiples_of_8():
    lengths = [seq_len_at(s, 128, 32, 300) for s in range(1, 401)]
    assert lengths[0] == 32 and lengths[299] == 128 and set(lengths[300:]) == {128}
    assert lengths == sorted(lengths) and all(n % 8 == 0 for n in lengths)
    assert lengths[150] == 80  # halfway: 32 + 96 * 150 / 300
    assert seq_len_at(1, 16, 32, 10) == 16  # blocks shorter than the start are never cut
    assert seq_len_at(1, 128, 3, 10) == 3  # a start below 8 is kept, not rounded to 0


def test_truncate_cuts_every_position_tensor_and_refuses_unlabelled_positions():
    batch = {"input_ids": torch.arange(12).view(2, 6), "attention_mask": torch.ones(2, 6),
             "labels": torch.full((2, 6), -100), "task": "mlm"}
    cut = truncate(batch, 4)
    assert cut["input_ids"].tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]]
    assert cut["attention_mask"].shape == cut["labels"].shape == (2, 4)
    assert cut["task"] == "mlm" and truncate(batch, 6) is batch
    qa = {"input_ids": torch.zeros(2, 6, dtype=torch.long), "start_positions": torch.tensor([5, 1])}
    with raises(ValueError, "labels", "(B, T)", "seq_len_warmup=0"):  # what it needs, the way out
        truncate(qa, 4)


def test_a_step_is_cut_to_its_length_and_a_new_length_is_reported_once():
    """Lengths 32, 32, 40, ... over a 24-step warmup from 32 to 128: `changed` is True
    wherever L differs from the step before, and nowhere else (not at step 1)."""
    micros = [{"input_ids": torch.zeros(2, 128, dtype=torch.long),
               "labels": torch.full((2, 128), -100)} for _ in range(2)]
    seen = []
    for step in range(1, 30):
        cut, changed = cut_for_step(micros, step, 32, 24)
        width = cut[0]["input_ids"].shape[1]
        assert all(b["input_ids"].shape[1] == b["labels"].shape[1] == width for b in cut)
        assert changed == (step > 1 and width != seen[-1]), step
        seen.append(width)
    assert seen == [seq_len_at(s, 128, 32, 24) for s in range(1, 30)] and seen[-1] == 128


def test_under_dynamic_padding_the_step_is_cut_by_its_widest_micro_batch(corpus, tmp_path):
    """L(step) is a function of the global batch, not of how it is split: a wider micro-batch
    after a narrower one is cut as the whole batch would be, and accumulating micro-batches
    equals the full batch."""
    def micro(width):
        return {"input_ids": torch.ones(2, width, dtype=torch.long),
                "labels": torch.ones(2, width, dtype=torch.long)}

    cut, _ = cut_for_step([micro(16), micro(64)], 11, 8, 10)  # past the warmup: whole
    assert [b["input_ids"].shape[1] for b in cut] == [16, 64]
    cut, _ = cut_for_step([micro(16), micro(64)], 4, 8, 10)
    assert [b["input_ids"].shape[1] for b in cut] == [16, seq_len_at(4, 64, 8, 10)]
    # End to end: examples of 8 or 64 tokens, padded per micro-batch.
    tok, _ = corpus
    g = torch.Generator().manual_seed(0)
    ids = [[tok.cls_id] + torch.randint(10, tok.vocab_size, (n,), generator=g).tolist() +
           [tok.sep_id] for n in ([6] * 3 + [62]) * 16]
    settings = dict(max_steps=4, seq_len_warmup=3, seq_len_start=8, batch_size=8, warmup=1)
    runs = {}
    for name, extra in (("full", {}), ("accumulated", {"micro_batch_size": 2})):
        model = tiny_model(tok)
        train(model, ids, collator(tok), train_config(**settings, **extra), tmp_path / name)
        runs[name] = [json.loads(line)["loss"] for line in open(tmp_path / name /
                                                                "metrics.jsonl")]
    assert runs["accumulated"] == pytest.approx(runs["full"], rel=1e-5)


class Recording(minibert.BertForMaskedLM):
    """Records the width of every batch it is given."""

    def __init__(self, config):
        super().__init__(config)
        self.widths = []

    def forward(self, input_ids, *args, **kwargs):
        self.widths.append(input_ids.shape[1])
        return super().forward(input_ids, *args, **kwargs)


def test_training_follows_the_schedule_and_its_first_step_is_the_cut_batch(corpus, tmp_path,
                                                                           monkeypatch):
    import minibert.training.engine

    # The allocator's kept memory is handed back at each change of length, and every
    # RELEASE_EVERY steps; recorded as the number of steps taken when it happens.
    releases = []
    monkeypatch.setattr(minibert.training.engine, "release_freed_memory",
                        lambda: releases.append(len(model.widths)))
    monkeypatch.setattr(minibert.training.engine, "RELEASE_EVERY", 5)
    tok, ds = corpus
    model = Recording(tiny_model(tok).config)
    reference = Recording(model.config)
    reference.load_state_dict(model.state_dict())
    cfg = train_config(max_steps=6, seq_len_warmup=4, seq_len_start=8)
    result = train(model, ds, collator(tok), cfg, tmp_path)
    # 8 + 24 * (step - 1) / 4 = 8, 14, 20, 26 -> multiples of 8, halves up; then full blocks
    assert model.widths == [8, 16, 24, 24, 32, 32]
    assert releases == [1, 2, 4, 5]  # 8 -> 16, 16 -> 24, 24 -> 32; after step 5
    assert result["tokens_seen"] == 16 * sum(model.widths)  # packed blocks: no padding
    # Step 1's logged loss is the loss of the first global batch cut by hand to 8 positions.
    _, indices = GlobalBatches(len(ds), 16, seed=0).next()
    batch = collator(tok)([ds[i] for i in indices], epoch=0)
    with torch.no_grad():
        want = reference(**{k: v[:, :8] for k, v in batch.items()}).loss.item()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[0]["step"] == 1 and rows[0]["loss"] == pytest.approx(want, rel=1e-5)


def test_resume_inside_the_warmup_is_exact(corpus, tmp_path):
    tok, ds = corpus
    reference = tiny_model(tok)
    cfg = dict(seq_len_warmup=5, seq_len_start=8)
    train(reference, ds, collator(tok), train_config(max_steps=8, **cfg), tmp_path / "ref")
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=3, decay_steps=8, **cfg),
          tmp_path / "run")
    resumed = tiny_model(tok, seed=7)
    train(resumed, ds, collator(tok), train_config(max_steps=8, **cfg), tmp_path / "run",
          resume=True)
    assert all(torch.equal(p, q) for p, q in zip(resumed.parameters(), reference.parameters()))
    with raises(ValueError, "seq_len_warmup", "5", "0") as info:
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=9, decay_steps=8),
              tmp_path / "run", resume=True)
    assert ("seq_len_warmup", "5", "0") in info.value.diffs



def test_a_checkpoint_without_a_setting_is_refused_naming_it(corpus, tmp_path):
    """No released minibert wrote checkpoints without these settings: one that lacks them is
    not read as if they held their defaults, but refused, naming each."""
    from minibert.training.state import SettingsMismatch

    tok, ds = corpus
    train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2, decay_steps=4),
          tmp_path)
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    for key in ("seq_len_warmup", "seq_len_start"):
        del state["train_config"][key]
    save_checkpoint(tmp_path / "checkpoints", 2, state)
    with raises(SettingsMismatch, "seq_len_warmup: checkpoint not set",
                "seq_len_start: checkpoint not set"):
        train(tiny_model(tok), ds, collator(tok), train_config(max_steps=4), tmp_path,
              resume=True)


def test_bad_warmup_settings_are_refused():
    # Against the horizon; without decay_steps that is train's to check (a resume may stop
    # earlier than the run's horizon), as test_engine_state does for the lr warmup.
    with raises(ValueError, "seq_len_warmup", "20 steps", "total_steps=10"):
        TrainConfig(max_steps=10, decay_steps=10, seq_len_warmup=20)
    with raises(ValueError, "seq_len_warmup=-1", ">= 0"):

        TrainConfig(seq_len_warmup=-1)
    with pytest.raises(ValueError, match="seq_len_start"):
        TrainConfig(seq_len_start=0)
