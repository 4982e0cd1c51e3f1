"""One process against two: DDP under torchrun gives the single-process run's losses."""

import json
import os
from pathlib import Path

import pytest
import torch

from engine_utils import MODERN_TINY, collator, tiny_corpus, tiny_model, torchrun, train_config
from minibert.training.distributed import unwrap
from minibert.training.engine import train

HERE = Path(__file__).parent


@pytest.mark.parametrize("n_examples,arch", [(None, "classic"), (37, "classic"),
                                             (None, "modern")])
def test_two_gloo_processes_match_one(tmp_path, n_examples, arch):
    """37 examples at batch 16: every third step is an epoch's last batch of 5, split 3 + 2
    over the processes, whose micro-batches (4) then hold 3 and 2 examples. "modern": the
    tiny model with ModernBERT's switches."""
    tok, ds = tiny_corpus(tmp_path)
    tok.save(tmp_path / "tokenizer")
    if n_examples is not None:
        ds = torch.utils.data.Subset(ds, list(range(n_examples)))
    single = tiny_model(tok, **(MODERN_TINY if arch == "modern" else {}))
    train(single, ds, collator(tok), train_config(), tmp_path / "one")

    torchrun(HERE / "ddp_worker.py", [tmp_path, tmp_path / "two", n_examples or "all", arch],
             tmp_path / "logs", timeout=240)

    def losses(d):
        return [json.loads(line)["loss"] for line in open(d / "metrics.jsonl")]

    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    # MFU counts every rank's tokens against every rank's ceiling: the FLOPs per token it
    # implies (mfu x ceiling x world / tokens_per_s) are those of the single process.
    rows = {n: [json.loads(line) for line in open(tmp_path / d / "metrics.jsonl")]
            for n, d in ((1, "one"), (2, "two"))}
    implied = {n: [r["mfu"] * 1e11 * n / r["tokens_per_s"] for r in rows[n]] for n in rows}
    assert implied[2] == pytest.approx(implied[1], rel=0.01)
    assert len(one) == len(two) == 6
    assert two == pytest.approx(one, rel=1e-5)
    state = torch.load(tmp_path / "two" / "final.pt", weights_only=True)
    for name, p in single.state_dict().items():
        assert (state[name] - p).norm() <= 1e-5 * p.norm().clamp_min(1e-12), name
    # only rank 0 wrote files
    assert sorted(os.listdir(tmp_path / "two")) == ["checkpoints", "final.pt", "metrics.jsonl"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's own, on importing dynamo
def test_unwrap_strips_compile_and_ddp(tmp_path):
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model)  # wrapping only; nothing is compiled until called
    assert next(iter(compiled.state_dict())).startswith("_orig_mod.")
    assert unwrap(compiled) is model
    assert unwrap(model) is model
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg",
                                         rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(compiled)
        assert unwrap(ddp) is model
        assert unwrap(torch.compile(ddp)) is model
        assert list(unwrap(ddp).state_dict()) == ["weight", "bias"]
    finally:
        torch.distributed.destroy_process_group()
