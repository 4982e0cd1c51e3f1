"""The benchmarks' transformers recipe, stopped and started again: the same weights as a run
never stopped, so that a pretraining longer than one sitting (bench_quality's five times the
budget) is the pretraining it says it is."""

import random

import pytest
import torch

import minibert
from engine_utils import WORDS, load_example


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("transformers")
    return load_example("bench_time_to_loss", "benchmarks")


def _data():
    rng = random.Random(0)
    tok = minibert.Tokenizer.train_from_iterator(
        [" ".join(rng.choices(WORDS, k=12)) for _ in range(200)], vocab_size=60,
        use_cache=False)
    ids = torch.randint(5, tok.vocab_size, (40, 16), generator=torch.Generator().manual_seed(0))
    return tok, [{"input_ids": row} for row in ids]  # 40 blocks: a new shuffle at step 2


def test_a_stopped_run_goes_on_to_the_weights_of_one_never_stopped(bench, tmp_path):
    tok, blocks = _data()
    whole = bench.run_transformers(tok, blocks, [], 4, eval_every=0, precision="fp32",
                                   horizon=4, warmup=1, keep_model=True)
    ckpt = tmp_path / "state.pt"
    first = bench.run_transformers(tok, blocks, [], 2, eval_every=0, precision="fp32",
                                   horizon=4, warmup=1, checkpoint=ckpt, save_every=1)
    assert ckpt.is_file() and first["steps"] == 2
    again = bench.run_transformers(tok, blocks, [], 4, eval_every=0, precision="fp32",
                                   horizon=4, warmup=1, keep_model=True, checkpoint=ckpt)
    assert len(again["step_seconds"]) == 4  # the first sitting's steps are counted
    expected = whole["model"].state_dict()
    for name, value in again["model"].state_dict().items():
        assert torch.equal(value, expected[name]), name
    assert torch.load(ckpt, weights_only=False)["step"] == 4
