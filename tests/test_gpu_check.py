"""benchmarks/gpu_check.sh must say what it did, and skip cleanly where there is no GPU."""

import subprocess
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the script runs for real")
def test_gpu_check_skips_cleanly_without_a_gpu():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no CUDA device" in done.stdout
