"""AdamW parameter groups and the learning-rate schedule."""

import math

import pytest
import torch

import minibert
from minibert.training.optim import build_optimizer, lr_at, param_groups, resolve_warmup, set_lr
from conftest import tiny_config
from facts import raises
from minibert.training.state import TrainConfig


def _names(model, params):
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_param_groups_decay_matrices_only():
    model = minibert.BertForMaskedLM(tiny_config())
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    decayed, plain = _names(model, decay["params"]), _names(model, no_decay["params"])
    # Matmul weights and embedding tables decay; every bias and LayerNorm parameter does not.
    assert "bert.blocks.0.attn.qkv.weight" in decayed
    assert "bert.blocks.1.ffn.down.weight" in decayed
    assert "bert.embeddings.word.weight" in decayed
    assert "bert.embeddings.position.weight" in decayed
    assert "head.bias" in plain and "bert.blocks.0.attn.qkv.bias" in plain
    for name in decayed:
        assert "norm" not in name and not name.endswith("bias"), name
    for name in plain:
        assert "norm" in name or name.endswith("bias"), name
    # Every trainable parameter is in exactly one group.
    all_ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert len(all_ids) == len(set(all_ids)) == len(list(model.parameters()))


def test_param_groups_shared_and_frozen_parameters():
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared, torch.nn.LayerNorm(4))
    model[3].bias.requires_grad_(False)
    groups = param_groups(model, 0.01)
    params = [p for g in groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == 3  # weight, bias, LN weight
    assert all(p is not model[3].bias for p in params)
    with pytest.raises(ValueError, match="weight_decay"):
        param_groups(model, -0.1)
    with raises(ValueError, "ReLU", "no trainable parameters"):
        param_groups(torch.nn.ReLU(), 0.01)


def test_build_optimizer_applies_decoupled_decay_to_matrices_only():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    opt = build_optimizer(model, lr=0.1, weight_decay=0.5)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-6
    assert opt.defaults["fused"] is True  # torch >= 2.4 has a fused AdamW on the CPU too
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # zero gradient: only the decay can move a weight
    opt.step()
    w, b, ln_w, ln_b = model.parameters()
    # Decoupled decay: w <- w - lr * wd * w, independent of the (zero) gradient.
    torch.testing.assert_close(w, before[0] * (1 - 0.1 * 0.5))
    for p, p0 in zip((b, ln_w, ln_b), before[1:]):
        torch.testing.assert_close(p, p0, rtol=0, atol=0)
    set_lr(opt, 0.02)
    assert all(g["lr"] == 0.02 for g in opt.param_groups)


def test_build_optimizer_rejects_betas_outside_0_1():
    with pytest.raises(ValueError, match="betas"):
        build_optimizer(torch.nn.Linear(2, 2), lr=1e-3, betas=(0.9, 1.0))


@pytest.mark.parametrize("bad, match", [
    (dict(adam_eps=0.0), "adam_eps"), (dict(lr=-1.0), "lr"), (dict(lr=0.0), "lr"),
    (dict(schedule="step"), "schedule"), (dict(lr=1.0, min_lr=2.0), "min_lr"),
    (dict(min_lr=-1.0), "min_lr"), (dict(warmup=11, decay_steps=10), "warmup"),
    (dict(warmup=-1), "warmup"), (dict(decay_steps=0), "decay_steps"),
])
def test_the_optimizer_and_schedule_settings_are_checked_once_by_trainconfig(bad, match):
    """build_optimizer and lr_at take a TrainConfig's numbers, checked there once: a bad
    rate, eps, schedule or warmup is refused when the settings are made, naming the field."""
    with pytest.raises(ValueError, match=match):
        TrainConfig(**bad)


def test_linear_warmup_ramp_and_peak():
    kw = dict(max_lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=12)
    assert [lr_at(s, **kw) for s in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert max(lr_at(s, **kw) for s in range(20)) == lr_at(4, **kw) == 1.0


def test_linear_decay_to_min_lr_then_flat():
    kw = dict(max_lr=1.0, min_lr=0.2, warmup_steps=2, total_steps=10)
    lrs = [lr_at(s, **kw) for s in range(2, 11)]
    steps = [b - a for a, b in zip(lrs, lrs[1:])]
    assert all(d == pytest.approx(-0.1) for d in steps)  # (1.0 - 0.2) / 8 per step
    assert lr_at(6, **kw) == pytest.approx(0.6)  # halfway: (max + min) / 2
    assert lr_at(10, **kw) == pytest.approx(0.2)
    assert lr_at(11, **kw) == lr_at(1000, **kw) == 0.2


def test_cosine_decay_midpoint_and_end():
    kw = dict(max_lr=1e-3, min_lr=1e-4, warmup_steps=10, total_steps=110, schedule="cosine")
    assert lr_at(10, **kw) == pytest.approx(1e-3)
    assert lr_at(60, **kw) == pytest.approx(5.5e-4)  # cos(pi/2) = 0: the mean of max and min
    assert lr_at(35, **kw) == pytest.approx(1e-4 + 9e-4 * (1 + math.cos(math.pi / 4)) / 2)
    assert lr_at(110, **kw) == pytest.approx(1e-4)
    lrs = [lr_at(s, **kw) for s in range(10, 111)]
    assert all(b < a for a, b in zip(lrs, lrs[1:]))  # strictly decreasing
    assert lr_at(500, **kw) == 1e-4


def test_no_warmup_starts_at_max_lr():
    kw = dict(max_lr=2.0, total_steps=4)
    assert [lr_at(s, **kw) for s in range(5)] == [2.0, 1.5, 1.0, 0.5, 0.0]


def test_resolve_warmup():
    assert resolve_warmup(100, 1000) == 100
    assert resolve_warmup(0.06, 10_000) == 600
    assert resolve_warmup(0.0, 50) == 0
    assert resolve_warmup(0.25, 10) == 2  # 2.5 rounds to the nearest even step
    for bad, facts in [(1.0, ["warmup=1.0", "[0, 1)"]), (1.5, ["warmup=1.5", "[0, 1)"]),
                       (-0.1, ["warmup=-0.1", "[0, 1)"]), (-3, ["warmup=-3", ">= 0"]),
                       (20, ["20 steps", "total_steps=10"]), (True, ["warmup=True", "(int)"]),
                       ("10", ["warmup='10'", "(int)"])]:
        with raises(ValueError, *facts):
            resolve_warmup(bad, 10)

