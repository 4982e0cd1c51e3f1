"""--gradient-checkpointing on every training script: the same command with it trains the
same weights, bit for bit, as without it (the recomputed blocks draw the same dropout)."""

import pytest

import minibert.model.model
from engine_utils import load_example
from script_inputs import SCRIPTS, make_inputs_with_teacher, script_argv

TRAINING = [s for s in SCRIPTS if s != "embed"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs_with_teacher(tmp_path_factory.mktemp("inputs"))


def _weights(out):
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.safetensors"))}


@pytest.mark.parametrize("script", TRAINING)
def test_gradient_checkpointing_trains_the_same_weights(inputs, tmp_path, script,
                                                        monkeypatch):
    recomputed = []
    plain = minibert.model.model.checkpoint
    monkeypatch.setattr(minibert.model.model, "checkpoint",
                        lambda *a, **k: recomputed.append(1) or plain(*a, **k))
    outs = []
    for extra in ([], ["--gradient-checkpointing"]):
        out = tmp_path / ("on" if extra else "off")
        args = script_argv(script, inputs, out, "--max-steps", "2", "--dropout", "0.1", *extra)
        assert load_example(script).main(args) == 0
        outs.append(_weights(out))
        assert bool(recomputed) == bool(extra)  # the flag, and only the flag, turns it on
    assert outs[0] and outs[0] == outs[1]
