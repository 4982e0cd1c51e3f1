"""A tiny corpus, tokenizer and model for training-loop tests (seconds on a CPU)."""

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minibert
from minibert.data import MLMCollator, PackedMLMDataset, tokenize_to_memmap
from minibert.training.engine import TrainConfig

WORDS = ("the cat sat on a mat while dogs ran far away from home and birds sang songs "
         "of rain in spring under green trees near rivers").split()


def tiny_corpus(tmp: Path, seq_len: int = 32):
    """(tokenizer, packed dataset) over 300 random documents."""
    rng = random.Random(0)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80))) for _ in range(300)]
    tok = minibert.Tokenizer.train_from_iterator(docs, vocab_size=200, cache_dir=tmp / "cache")
    tokens = tokenize_to_memmap(docs, tok, tmp / "corpus.tok")
    return tok, PackedMLMDataset(tokens, seq_len=seq_len)


def tiny_model(tok, seed: int = 0, dropout: float = 0.0, **overrides):
    minibert.set_seed(seed)
    config = minibert.BertConfig.preset("tiny", vocab_size=tok.vocab_size,
                                        max_position_embeddings=64, hidden_dropout=dropout,
                                        attention_dropout=dropout, **overrides)
    return minibert.BertForMaskedLM(config)


# ModernBERT's switches on the tiny model (a local window of 8 over 32 positions, so the
# sliding-window layers do cut), for the exactness tests of the modern encoder.
MODERN_TINY = dict(norm_position="pre", position="rope", mlp="geglu", bias=False,
                   first_block_attn_norm=False, type_vocab_size=0, task_head="transform",
                   global_every=2, local_window=8, intermediate_size=352)


# Two runs equal in exact arithmetic (one batch against its micro-batches) still differ by
# fp32 rounding, which six AdamW steps amplify to a few 1e-6 of relative parameter norm,
# more or less as the data and the vocabulary fall. Weighting the micro-batches wrongly
# (the mean of their means) moves the same runs 0.19 apart.
FP32_RUNS_APART = 1e-5


def same_logged_losses(a: list, b: list) -> bool:
    """The log keeps a loss to 5 decimals (engine.py): two losses a rounding apart can
    straddle a last digit, so they agree to one unit of it, not to a relative 1e-6."""
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 + 1e-6 * abs(y) for x, y in zip(a, b))


def train_config(**overrides) -> TrainConfig:
    # fp32: the exactness tests compare bits, and "auto" picks bf16 on a CPU with native bf16.
    fields = dict(batch_size=16, max_steps=6, lr=2e-3, warmup=2, log_every=1,
                  peak_flops=1e11, progress=False, precision="fp32")
    fields.update(overrides)
    return TrainConfig(**fields)


def sigterm_in_forward(model: torch.nn.Module, call: int) -> torch.nn.Module:
    """`model`, sending this process SIGTERM from inside its `call`-th forward: during that
    step (one micro-batch a step), whichever batches the engine has prepared ahead of it."""
    forward, calls = model.forward, []

    def forward_then_preempt(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGTERM)  # the run's own handler takes it
        return forward(*args, **kwargs)

    model.forward = forward_then_preempt
    return model


def collator(tok):
    return MLMCollator(tok, mlm_probability=0.15, seed=0)


def wikitext_folder(folder: Path, sizes=(("train", 120), ("valid", 20))) -> Path:
    """A WikiText-shaped folder ({split}.txt with ' = Title = ' headings) of random articles."""
    rng = random.Random(0)
    for split, n in sizes:
        lines = []
        for a in range(n):
            lines += ["", f" = Article {a} = ", ""]
            lines += [" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 90)))
                      for _ in range(3)]
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return folder


def blimp_folder(folder: Path, pairs: int = 12) -> Path:
    """Two BLiMP paradigms of `pairs` minimal pairs each, in BLiMP's jsonl layout."""
    import json

    for name, (good, bad) in {"agreement": ("the cat is here .", "the cat are here ."),
                              "order": ("it was a good film .", "it was film a good .")}.items():
        with open(folder / f"{name}.jsonl", "w") as f:
            for i in range(pairs):
                f.write(json.dumps({"sentence_good": f"{good} {i}", "sentence_bad": f"{bad} {i}",
                                    "field": "syntax", "UID": name, "pairID": str(i)}) + "\n")
    return folder


def weights_file(folder: Path) -> Path:
    """A model folder's weights file, found rather than named: its name says who loads it
    (README, "Which folders transformers loads")."""
    (found,) = folder.glob("*.safetensors")
    return found


def torchrun(script: Path, args: list, logs: Path, timeout: int = 300) -> None:
    """Run `script args` under torchrun as 2 CPU processes of one thread each (this folder and
    the repository on their path), and fail with every rank's own stderr: each rank writes
    its output to a file under `logs` (torchrun's --redirects), so the one that failed says
    why, however long the other's output."""
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", "--log-dir", str(logs), "--redirects", "3",
                           str(script), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        ranks = "".join(f"\n---- {f.relative_to(logs)}\n{f.read_text()[-4000:]}"
                        for f in sorted(logs.rglob("stderr.log")))
        pytest.fail(f"torchrun exited {done.returncode}\n---- torchrun\n{done.stderr[-3000:]}"
                    f"{ranks}", pytrace=False)


def from_checkpoint(argv: list) -> list:
    """`argv` without --preset and --vocab-size where it gives --init-from: the scripts refuse
    the flags of a new model beside a checkpoint, which sets the model itself."""
    if "--init-from" not in argv:
        return list(argv)
    out: list = []
    for arg in argv:
        if out and out[-1] in ("--preset", "--vocab-size"):
            out.pop()
        else:
            out.append(arg)
    return out


def step_clock(monkeypatch, seconds: float) -> list:
    """A budget's clock (training/budget.py) under which every timed step and evaluation batch
    takes `seconds`: it advances by that much each time it is read, so what a --time-budget
    fits does not depend on this machine. Returns the list of readings, to see it was read."""
    import itertools

    from minibert.training import budget
    readings = []
    ticks = itertools.count()

    def clock() -> float:
        readings.append(None)
        return next(ticks) * seconds

    monkeypatch.setattr(budget, "clock", clock)
    return readings


def load_example(name: str, folder: str = "examples"):
    """Import <folder>/<name>.py as a module (examples/ and benchmarks/ are not packages);
    a script's main() does not run."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True, scope="module")
def quick_runs():
    """For the script tests (import it into the test module): no peak-FLOPs timing, which the
    first run on a machine does for its MFU column and is not what they test, and one thread:
    these models are too small to gain from more, and spinning OpenMP threads slow down many
    times over when another process shares the cores."""
    import minibert.machine.meters

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(minibert.machine.meters, "measure_peak_flops", lambda *a, **k: 1e12)
        yield
    torch.set_num_threads(threads)
