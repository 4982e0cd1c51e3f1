"""benchmarks/gpu_check.sh: skips cleanly without a GPU, and runs as it is on a bare CUDA
machine (python3 only, the checkout on PYTHONPATH, each check to the end even if one fails)."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from facts import assert_carries

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the script runs for real")
def test_gpu_check_skips_cleanly_without_a_gpu():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no CUDA device" in done.stdout


def _fake_bin(tmp_path: Path, python3_body: str) -> dict:
    """A PATH whose `python` fails and whose `python3` is the given bash body."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("python", 'echo "python alias used" >&2; exit 127'),
                       ("python3", python3_body)):
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": ""}


def test_every_check_runs_through_python3_with_the_checkout_on_pythonpath(tmp_path):
    """A python3 that reports a GPU and records its calls; the MFU check fails, and the
    checks after it still run, and the script's exit status says that one failed."""
    calls = tmp_path / "calls.txt"
    env = _fake_bin(tmp_path, f"""echo "$PYTHONPATH :: $*" >> {calls}
case "$*" in
  *torch.cuda.is_available*) echo "UserWarning: something torch says on import" >&2; echo True ;;
  *bench_engine_overhead*) echo "mfu output"; exit 3 ;;
esac""")
    results = tmp_path / "results"
    done = subprocess.run(["bash", str(SCRIPT), str(results)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "python alias used" not in done.stderr
    assert_carries(done.stdout, "mfu", "FAILED", "exit 3")  # the check, and its status
    lines = calls.read_text().splitlines()
    assert all(line.startswith(f"{ROOT} :: ") for line in lines)  # the checkout, first
    commands = " | ".join(lines)
    for expected in ("-m pytest -q -p no:cacheprovider tests/test_cuda.py",
                     "bench_engine_overhead.py --device cuda --preset base --precision bf16",
                     "bench_vs_transformers.py --device cuda", "bench_attention.py --device cuda"):
        assert expected in commands
    assert commands.index("bench_engine_overhead") < commands.index("bench_attention")
    assert (results / "mfu.txt").read_text() == "mfu output\n"
    assert {p.name for p in results.iterdir()} == {
        "device.txt", "tests.txt", "mfu.txt", "vs_transformers.txt", "attention.txt"}


def test_a_python3_without_torch_is_an_error_not_a_missing_gpu(tmp_path):
    env = _fake_bin(tmp_path, 'echo "ModuleNotFoundError: No module named \'torch\'" >&2; exit 1')
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 1
    assert_carries(done.stderr, "python3", "torch", "ModuleNotFoundError")

    assert "no CUDA device" not in done.stdout
