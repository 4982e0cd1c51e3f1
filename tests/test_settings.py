"""A run's settings by concern (training/settings.py): five groups, each validated where it is
declared, and every setting still a keyword and an attribute of TrainConfig by its own name,
recorded flat in checkpoints as before the groups."""

from dataclasses import replace

import pytest

from engine_utils import collator, tiny_corpus, tiny_model, train_config
from minibert.training.checkpoint import load_checkpoint
from minibert.training.engine import train
from minibert.training.settings import (BatchConfig, CheckpointConfig, LogConfig, OptimConfig,
                                        ProcessConfig, TrainConfig)

# What a checkpoint's "train_config" has recorded since before the settings were grouped:
# the identity a resume compares, name by name (state.check_identity).
RECORDED = {"batch_size", "micro_batch_size", "max_steps", "decay_steps", "lr", "min_lr",
            "warmup", "schedule", "weight_decay", "adam_eps", "max_grad_norm", "precision",
            "seed", "log_every", "eval_every", "eval_batches", "eval_at_start", "save_every",
            "keep_checkpoints", "max_bad_steps", "auto_micro_batch", "compile", "progress",
            "seq_len_warmup", "seq_len_start", "peak_flops", "handle_signals",
            "release_memory"}


def test_each_setting_lives_in_its_group_and_reads_by_its_own_name():
    cfg = TrainConfig(lr=3e-4, batch_size=64, eval_every=50, save_every=100,
                      handle_signals=False, max_steps=20)
    assert cfg.optim == OptimConfig(lr=3e-4)
    assert cfg.batch == BatchConfig(batch_size=64)
    assert cfg.log == LogConfig(eval_every=50)
    assert cfg.checkpoints == CheckpointConfig(save_every=100)
    assert cfg.process == ProcessConfig(handle_signals=False)
    assert (cfg.lr, cfg.batch_size, cfg.eval_every, cfg.max_steps) == (3e-4, 64, 50, 20)
    assert TrainConfig(optim=OptimConfig(lr=3e-4), batch=BatchConfig(batch_size=64),
                       log=LogConfig(eval_every=50), checkpoints=CheckpointConfig(save_every=100),
                       process=ProcessConfig(handle_signals=False), max_steps=20) == cfg


def test_replace_by_a_settings_own_name_changes_a_copy():
    cfg = TrainConfig(micro_batch_size=8)
    other = replace(cfg, micro_batch_size=4, decay_steps=500)
    assert (other.micro_batch_size, other.decay_steps) == (4, 500)
    assert (cfg.micro_batch_size, cfg.decay_steps) == (8, None)
    other.lr = 5e-4  # set in its group, of this config alone
    assert (other.optim.lr, cfg.lr) == (5e-4, 1e-3)


@pytest.mark.parametrize("group, settings, message", [
    (OptimConfig, {"lr": 0.0}, "lr > 0"),
    (OptimConfig, {"max_grad_norm": 0.0}, "max_grad_norm"),
    (OptimConfig, {"schedule": "step"}, "schedule"),
    (BatchConfig, {"batch_size": 0}, "batch_size"),
    (BatchConfig, {"precision": "fp8"}, "precision"),
    (LogConfig, {"log_every": 0}, "log_every"),
    (LogConfig, {"peak_flops": -1.0}, "peak_flops"),
    (CheckpointConfig, {"keep_checkpoints": 0}, "keep_checkpoints"),
])
def test_a_group_refuses_a_bad_setting_where_it_is_declared(group, settings, message):
    with pytest.raises(ValueError, match=message):
        group(**settings)
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


def test_a_setting_of_no_group_is_refused_by_name():
    with pytest.raises(TypeError, match="'lrate'"):
        TrainConfig(lrate=1e-3)
    with pytest.raises(AttributeError, match="'lrate'"):
        TrainConfig().lrate


def test_checkpoints_record_the_settings_flat_as_before_the_groups(tmp_path):
    tok, ds = tiny_corpus(tmp_path)
    cfg = train_config(max_steps=2, warmup=0)
    train(tiny_model(tok), ds, collator(tok), cfg, tmp_path / "run")
    saved = load_checkpoint(sorted((tmp_path / "run" / "checkpoints").iterdir())[-1])
    assert set(saved["train_config"]) == RECORDED
    assert saved["train_config"]["lr"] == cfg.lr and saved["train_config"]["batch_size"] == 16
    assert TrainConfig(**saved["train_config"]) == replace(cfg, decay_steps=2)
