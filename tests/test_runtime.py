"""Seeds and RNG state, peak memory, the CPU allocator setting, FLOPs and MFU, the
environment report, unwrap."""

import io
import logging
import os
import platform
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

import minibert
from conftest import tiny_config
from minibert.runtime import (
    environment_report,
    flops_per_token,
    log_environment,
    measure_peak_flops,
    mfu,
    peak_memory_mb,
    reset_peak_memory,
    rng_state,
    set_rng_state,
    set_seed,
    unwrap,
)


def _draws():
    return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(),
            np.random.randn(), torch.rand(3).tolist(), torch.randn(2).tolist())


@pytest.fixture
def restore_determinism():
    """set_seed(deterministic=True) flips process-wide switches; put them back afterwards."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1:3]
    if saved[3] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[3]


def test_set_seed_repeats_all_three_libraries(restore_determinism):
    set_seed(123)
    first = _draws()
    set_seed(123)
    assert _draws() == first
    set_seed(124)
    assert _draws() != first
    set_seed(5, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"]
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            set_seed(bad)


def test_rng_state_survives_weights_only_checkpoint_and_repeats_draws():
    set_seed(7)
    _draws()
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    np.random.randn()  # and possibly in numpy's
    state = rng_state()
    expected = _draws()
    buffer = io.BytesIO()
    torch.save({"rng": state}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["rng"]
    set_seed(999)  # move every generator somewhere else
    _draws()
    set_rng_state(loaded)
    assert _draws() == expected


def test_set_rng_state_names_missing_parts():
    with pytest.raises(ValueError, match="numpy"):
        set_rng_state({"python": random.getstate(), "torch": torch.get_rng_state()})


def test_cpu_peak_memory_rises_with_allocation_and_resets():
    reset_peak_memory("cpu")
    base = peak_memory_mb("cpu")
    big = torch.ones(64 * 2**20)  # 256 MiB, written so the pages are resident
    assert peak_memory_mb("cpu") >= base + 200
    del big
    reset_peak_memory("cpu")
    # After the reset the peak is the current resident size, without the freed 256 MiB.
    assert peak_memory_mb("cpu") < base + 100


# Allocates and frees a 64 MiB tensor a few times and prints the minor page faults of each
# cycle, with or without keep_freed_memory, in a process of its own (the setting is
# process-wide and permanent).
_FAULTS = """
import resource, sys, torch
from minibert.runtime import environment_report, keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
assert environment_report("cpu")["freed_memory_kept"] == kept
print(kept)
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 * 2**20)  # 64 MiB, written in full
    del x
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_keep_freed_memory_removes_the_page_faults_of_reallocation():
    def run(mode):
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0] == "True", [int(n) for n in out[1:]]

    kept, faults_kept = run("keep")
    default, faults_default = run("default")
    assert kept and not default
    # By default every cycle is a fresh mmap whose pages all fault in again: 16,384 of 4 KiB
    # (32 where transparent huge pages are always on).
    assert min(faults_default) >= 16, faults_default
    # Kept, the block is reused already mapped once the heap has settled, which takes up to
    # four cycles here: from then on no cycle faults.
    assert max(faults_kept[-6:]) < 100, faults_kept


def test_flops_per_token_against_hand_count():
    config = tiny_config()  # V=99, H=32, L=2, I=64
    T = 16
    per_layer = 3 * 32 * 32 + 32 * 32 + 32 * 64 + 64 * 32  # Q,K,V + output + up + down
    assert per_layer == 8192
    encoder = 2 * per_layer
    head = 32 * 32 + 99 * 32  # transform + tied decoder
    attention = 2 * (2 * T * 32 + 2 * T * 32) * 3  # layers * (QK^T + PV) * (fwd + bwd)
    assert flops_per_token(config, T) == 6 * (encoder + head) + attention
    assert flops_per_token(config, T, mlm_fraction=0.15) == pytest.approx(
        6 * (encoder + 0.15 * head) + attention)
    assert flops_per_token(config, T, 0.0) == 6 * encoder + 12 * 2 * 32 * T
    with pytest.raises(ValueError, match="mlm_fraction"):
        flops_per_token(config, T, 1.5)
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(config, 0)


def test_flops_match_parameter_count_of_the_model():
    """The matmul parameters counted by hand are the model's matrices, minus the lookups."""
    config = tiny_config()
    model = minibert.BertForMaskedLM(config)
    matmul = sum(p.numel() for n, p in model.named_parameters()
                 if p.ndim == 2 and "embeddings" not in n)
    tied_decoder = config.vocab_size * config.hidden_size
    T = 8
    assert flops_per_token(config, T) == 6 * (matmul + tied_decoder) + 12 * 2 * 32 * T


def test_mfu_arithmetic_and_measured_peak():
    assert mfu(1000.0, 6e6, 1e10) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="peak_flops"):
        mfu(1.0, 1.0, 0.0)
    peak = measure_peak_flops("cpu", torch.float32, n=256, repeats=3)
    assert 1e8 < peak < 1e14  # a real CPU: between 0.1 GFLOP/s and 100 TFLOP/s


def test_environment_report_and_warnings(caplog):
    report = environment_report("cpu")
    assert report["torch"] == torch.__version__
    assert report["torch_cuda"] == torch.version.cuda
    assert report["bf16_supported"] is True and report["device_name"]
    assert report["torch_threads"] == torch.get_num_threads() and report["cpu_count"] >= 1
    with caplog.at_level(logging.INFO, logger="minibert.runtime"):
        assert log_environment("cpu", "fp32")["warnings"] == []
    assert "environment:" in caplog.text and "WARNING" not in caplog.text

    threads = torch.get_num_threads()
    torch.set_num_threads(report["cpu_count"] + 2)
    try:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="minibert.runtime"):
            log_environment("cpu")
        assert "oversubscription" in caplog.text
    finally:
        torch.set_num_threads(threads)

    with pytest.raises(ValueError, match="precision"):
        log_environment("cpu", "int8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_environment_warns_when_cuda_is_requested_without_cuda(caplog):
    with caplog.at_level(logging.WARNING, logger="minibert.runtime"):
        report = log_environment("cuda", "bf16")
    assert report["warnings"] and "cuda" in caplog.text
    assert report["device_available"] is False


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
