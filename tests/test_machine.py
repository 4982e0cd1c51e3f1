"""Seeds and RNG state, peak memory, the CPU allocator setting, FLOPs, MFU and its ceiling,
the environment report, bf16 on the CPU, the precision choice.

What depends on the machine these run on (whether its bf16 matmuls are as fast as its flags
say, the page faults a reallocation costs with and without keep_freed_memory, the matmul
rate it reaches) is measured by benchmarks/check_machine.py instead."""

import io
import logging
import math
import os
import platform
import random
import re
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import minibert
from minibert.machine.meters import flops_per_token
from conftest import tiny_config
from engine_utils import load_example
from facts import assert_carries

import minibert.machine.meters as meters
import minibert.machine.precision as precision
from minibert.machine.environment import environment_report, log_environment
from minibert.machine.memory import limit_kernel_cache  # the real one: conftest stubs the module's
from minibert.machine.meters import machine_key, measure_peak_flops, mfu, mfu_ceiling
from minibert.machine.precision import auto_precision, cpu_bf16_native, resolve_precision
from minibert.training.rng import rng_state, set_rng_state, set_seed


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


# In a process of its own: one that has kept freed memory (keep_freed_memory, as a script's
# main() run in the test process does) rightly holds a freed 256 MiB resident after the reset.
_PEAK = """
import torch
from minibert.machine.memory import peak_memory_mb, reset_peak_memory
reset_peak_memory("cpu")
base = peak_memory_mb("cpu")
big = torch.ones(64 * 2**20)  # 256 MiB, written so the pages are resident
grown = peak_memory_mb("cpu") - base
del big
reset_peak_memory("cpu")
print(grown, peak_memory_mb("cpu") - base)
"""


def test_cpu_peak_memory_rises_with_allocation_and_resets():
    grown, after_reset = map(float, subprocess.run(
        [sys.executable, "-c", _PEAK], capture_output=True, text=True, check=True).stdout.split())
    assert grown >= 200
    # After the reset the peak is the current resident size, without the freed 256 MiB.
    assert after_reset < 100


# In a process of its own (the setting is process-wide and permanent): whether freed memory
# is kept, as reported before and after, then where glibc serves a 64 MiB block from (the
# growth of the heap's top, in MiB), and how much of that growth a free leaves in place.
_HEAP = """
import ctypes, sys
from minibert.machine.environment import environment_report
from minibert.machine.memory import keep_freed_memory
libc = ctypes.CDLL(None)
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
said = [environment_report("cpu")["freed_memory_kept"]]
if sys.argv[1] == "keep":
    said += [keep_freed_memory(), keep_freed_memory()]
said.append(environment_report("cpu")["freed_memory_kept"])
top = libc.sbrk(0)
block = libc.malloc(64 * 2**20)
grown = libc.sbrk(0) - top
libc.free(block)
print(*said, grown // 2**20, (libc.sbrk(0) - top) // 2**20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_keep_freed_memory_serves_large_blocks_from_the_heap_and_keeps_them():
    """By default glibc maps a block this large on its own and unmaps it when freed, so its
    pages fault in again at the next allocation; kept, the block comes from the heap, which a
    free does not trim. (The page faults themselves, which depend on the kernel, are counted
    by benchmarks/check_machine.py.)"""
    def run(mode):
        return subprocess.run([sys.executable, "-c", _HEAP, mode], capture_output=True,
                              text=True, check=True).stdout.split()

    *said, grown, left = run("keep")
    assert said == ["False", "True", "True", "True"]  # made, made again, reported
    assert int(grown) >= 32 and int(left) == int(grown), (grown, left)
    *said, grown, left = run("default")
    assert said == ["False", "False"] and int(grown) == int(left) == 0, (grown, left)


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
    for dtype in (torch.float32, torch.bfloat16):  # bf16 too: emulated, it must still be quick
        peak = measure_peak_flops("cpu", dtype, max_n=256)
        assert math.isfinite(peak) and peak > 0
    # What rate a real CPU gives is the machine's: benchmarks/check_machine.py checks it.


def test_the_mfu_ceiling_is_measured_once_per_machine_and_read_back(tmp_path, monkeypatch):
    """The first call measures and records; every later one, in this process or another,
    reads the record, whatever a measurement would give now. Each dtype and thread count
    has its own entry; a damaged file is measured again, an unwritable one says so."""
    import json

    rates, calls = iter([1e11, 5e11, 3e10, 7e10, 2e11]), []

    def fake_peak(device, dtype, **kwargs):
        calls.append(dtype)
        return next(rates)

    monkeypatch.setattr(meters, "measure_peak_flops", fake_peak)
    first = mfu_ceiling("cpu", torch.float32, tmp_path)
    assert first.flops_per_s == 1e11 and "measured now and recorded in" in first.source
    again = mfu_ceiling("cpu", torch.float32, tmp_path)
    assert again.flops_per_s == 1e11 and "recorded in" in again.source
    assert str(tmp_path / "mfu_ceilings.json") in again.source
    assert calls == [torch.float32]
    assert mfu_ceiling("cpu", torch.bfloat16, tmp_path).flops_per_s == 5e11  # its own entry
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:  # another thread count, another ceiling
        assert machine_key("cpu", torch.float32) not in json.loads(
            (tmp_path / "mfu_ceilings.json").read_text())
        assert mfu_ceiling("cpu", torch.float32, tmp_path).flops_per_s == 3e10
    finally:
        torch.set_num_threads(threads)
    assert mfu_ceiling("cpu", torch.float32, tmp_path).flops_per_s == 1e11
    # By default under $MINIBERT_CACHE (conftest points it at this session's folder).
    monkeypatch.setenv("MINIBERT_CACHE", str(tmp_path / "env"))
    assert mfu_ceiling("cpu", torch.float32).flops_per_s == 7e10
    assert (tmp_path / "env" / "mfu_ceilings.json").is_file()
    (tmp_path / "env" / "mfu_ceilings.json").write_text('{"cut sh')
    assert mfu_ceiling("cpu", torch.float32).flops_per_s == 2e11
    assert mfu_ceiling("cpu", torch.float32).flops_per_s == 2e11
    (tmp_path / "a file").write_text("")
    monkeypatch.setattr(meters, "measure_peak_flops", lambda *a, **k: 4e10)
    alone = mfu_ceiling("cpu", torch.float32, tmp_path / "a file")
    assert alone.flops_per_s == 4e10 and "could not be recorded" in alone.source


def _simulated_matmuls(monkeypatch, flops_per_s: float) -> list:
    """Replace torch.mm and the clock of meters.py by a simulated device of a given speed.

    Each (m, k) @ (k, n) product is recorded and advances the clock by 2 m k n / flops_per_s
    instead of running, so what `measure_peak_flops` would cost on that device is counted
    exactly, whatever else runs on this machine meanwhile.
    """
    now, calls = [0.0], []

    def mm(a, b):
        calls.append((a.shape[0], a.shape[1], b.shape[1]))
        now[0] += 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / flops_per_s
        return a

    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(meters, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    return calls


@pytest.mark.parametrize("flops_per_s", [1.3e9, 86e9, 1e12, 1e15])  # emulated bf16 ... a GPU
def test_measure_peak_flops_costs_under_a_second_at_any_speed(monkeypatch, flops_per_s):
    calls = _simulated_matmuls(monkeypatch, flops_per_s)
    peak = measure_peak_flops("cpu", torch.bfloat16)
    issued = sum(2.0 * m * k * n for m, k, n in calls)
    # 1.3 GFLOP/s is an emulated bf16 matmul on an AVX2 CPU; 2048^3 products, as before,
    # took 13 s each there.
    assert issued / flops_per_s <= 1.0, (len(calls), max(calls))
    assert peak == pytest.approx(flops_per_s)
    # On a fast device the matrices still grow to a well-shaped size (up to 4096).
    if flops_per_s >= 1e12:
        assert max(calls)[0] >= 2048


def _cpuinfo(flags: str) -> str:
    return (f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n\n"
            f"processor\t: 1\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n")


@pytest.fixture
def fresh_bf16_caches():
    """The CPU's flags are read once per process: read them anew."""
    precision.cpu_bf16_flags.cache_clear()
    yield
    precision.cpu_bf16_flags.cache_clear()


def test_cpu_bf16_native_from_the_cpu_flags(monkeypatch, fresh_bf16_caches):
    for flags, native in (("avx2 fma", False), ("avx512f avx512bw", False),
                          ("avx512f avx512_bf16", True), ("amx_bf16 amx_tile", True)):
        monkeypatch.setattr(precision, "_read_cpuinfo", lambda flags=flags: _cpuinfo(flags))
        precision.cpu_bf16_flags.cache_clear()
        assert cpu_bf16_native() is native, flags
    # Arm lists its features under "Features"; bf16 is FEAT_BF16 (BFMMLA).
    monkeypatch.setattr(precision, "_read_cpuinfo", lambda: "Features\t: fp asimd bf16 i8mm\n")
    precision.cpu_bf16_flags.cache_clear()
    assert cpu_bf16_native() is True
    # Without /proc/cpuinfo (macOS, Windows) the CPU does not say: unknown, and nothing timed.
    monkeypatch.setattr(meters, "measure_peak_flops", lambda *a, **k: pytest.fail("timed"))
    monkeypatch.setattr(precision, "_read_cpuinfo", lambda: None)
    precision.cpu_bf16_flags.cache_clear()
    assert cpu_bf16_native() is None


def test_resolve_precision_auto_on_cpu(monkeypatch, fresh_bf16_caches):
    cpu = torch.device("cpu")
    for flags, expected, reason in (
            ("avx2 fma", "fp32", "this CPU reports none of amx_bf16, avx512_bf16, bf16: bf16 "
                                 "matmuls would be emulated"),
            ("avx512_bf16 amx_bf16", "bf16", "this CPU reports amx_bf16, avx512_bf16: native "
                                             "bf16 matmuls")):
        monkeypatch.setattr(precision, "_read_cpuinfo", lambda flags=flags: _cpuinfo(flags))
        precision.cpu_bf16_flags.cache_clear()
        assert resolve_precision("auto", cpu) == expected
        assert auto_precision(cpu) == (expected, reason)
    monkeypatch.setattr(precision, "_read_cpuinfo", lambda: None)
    precision.cpu_bf16_flags.cache_clear()
    choice, reason = auto_precision(cpu)
    assert choice == "fp32" and "no CPU flags" in reason
    assert resolve_precision("bf16", cpu) == "bf16"  # asked for: allowed, with a warning
    assert resolve_precision("fp32", cpu) == "fp32"
    with pytest.raises(ValueError, match="fp16"):
        resolve_precision("fp16", cpu)


def _as_in_a_new_process():
    """Forget what precision.py keeps per process (the CPU's flags), as a new run would."""
    for cached in [f for f in vars(precision).values() if hasattr(f, "cache_clear")]:
        cached.cache_clear()


@pytest.mark.parametrize("cpuinfo, expected", [
    (_cpuinfo("avx512f amx_bf16 amx_tile"), "bf16"),
    (_cpuinfo("avx2 fma"), "fp32"),
    (None, "fp32"),  # no flags to read (macOS, Windows)
])
def test_auto_precision_is_the_same_however_fast_a_matmul_runs_now(monkeypatch, cpuinfo,
                                                                   expected):
    """A timed bf16-against-fp32 probe flipped "auto" between starts on a busy machine (the
    same command then ended with other weights). Whatever a clock would say at each start,
    from 100x slower to 100x faster, the decision is the same: the CPU's flags decide."""
    rates = iter([1e9, 1e13, 1e11, 1e9, 5e12, 2e9, 1e13, 1e9] * 8)
    fake = lambda *a, **k: next(rates)  # noqa: E731
    monkeypatch.setattr(meters, "measure_peak_flops", fake)
    monkeypatch.setattr(precision, "measure_peak_flops", fake, raising=False)
    monkeypatch.setattr(precision, "_read_cpuinfo", lambda: cpuinfo)
    decisions = set()
    for _ in range(8):
        _as_in_a_new_process()
        decisions.add(resolve_precision("auto", torch.device("cpu")))
    _as_in_a_new_process()
    assert decisions == {expected}


def test_environment_report_and_warnings(caplog):
    report = environment_report("cpu")
    assert report["torch"] == torch.__version__
    assert report["torch_cuda"] == torch.version.cuda
    assert report["bf16_supported"] is True and report["device_name"]
    assert report["torch_threads"] == torch.get_num_threads() and report["cpu_count"] >= 1
    with caplog.at_level(logging.INFO, logger="minibert.machine.environment"):
        assert log_environment("cpu", "fp32")["warnings"] == []
    assert "environment:" in caplog.text and "WARNING" not in caplog.text

    threads = torch.get_num_threads()
    torch.set_num_threads(report["cpu_count"] + 2)
    try:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="minibert.machine.environment"):
            log_environment("cpu")
        # the threads, the CPUs, and the call that sets them
        assert_carries(caplog.text, f"{report['cpu_count'] + 2} threads",
                       f"{report['cpu_count']} CPUs",
                       f"torch.set_num_threads({report['cpu_count']})")
    finally:
        torch.set_num_threads(threads)

    with pytest.raises(ValueError, match="precision"):
        log_environment("cpu", "int8")


def test_environment_says_whether_bf16_is_native_and_warns_when_emulated(monkeypatch, caplog):
    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: False)
    monkeypatch.setattr(meters, "measure_peak_flops", lambda *a, **k: pytest.fail("timed"))
    report = environment_report("cpu")
    assert report["bf16_native"] is False
    assert report["bf16_supported"] is True  # autocast runs; it is slow, not refused
    with caplog.at_level(logging.WARNING, logger="minibert.machine.environment"):
        assert log_environment("cpu", "fp32")["warnings"] == []
        report = log_environment("cpu", "bf16")
    warnings = report["warnings"]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert_carries(warnings[0], "bf16", "emulated", report["device_name"], "fp32")
    assert caplog.text.count("emulated") == 1

    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: None)  # no flags to read
    report = log_environment("cpu", "bf16")
    assert report["bf16_native"] is None and len(report["warnings"]) == 1
    assert_carries(report["warnings"][0], "bf16", report["device_name"])

    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: True)
    report = log_environment("cpu", "bf16")
    assert report["bf16_native"] is True and report["warnings"] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_environment_warns_when_cuda_is_requested_without_cuda(caplog):
    with caplog.at_level(logging.WARNING, logger="minibert.machine.environment"):
        report = log_environment("cuda", "bf16")
    assert report["warnings"] and "cuda" in caplog.text
    assert report["device_available"] is False


# ---- the benchmarks on a CPU that emulates bf16 -------------------------------------------
# (here rather than in a file of their own: they test how scripts use cpu_bf16_native)

def _benchmark(name: str):
    return load_example(name, "benchmarks")


def test_bench_train_rows_stay_fp32_without_bf16():
    bench = _benchmark("bench_train")
    rows = bench.cumulative_rows(no_compile=True, skip_bf16=True)
    assert [label for label, _ in rows] == ["baseline", "+ gradient accumulation (4 steps)",
                                            "+ optimized attention (sdpa)",
                                            "+ sparse MLM prediction",
                                            "+ packing instead of padding"]
    assert {settings["precision"] for _, settings in rows} == {"fp32"}
    assert rows[-1][1]["packed"] and rows[-1][1]["sparse"]  # the other levers are all there
    with_bf16 = bench.cumulative_rows(no_compile=True)
    assert [s["precision"] for _, s in with_bf16] == ["fp32"] * 2 + ["bf16"] * 4


@pytest.mark.parametrize("name", ["bench_vs_transformers", "bench_unpadding"])
def test_benchmarks_skip_emulated_bf16_unless_asked(monkeypatch, name):
    bench = _benchmark(name)
    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: False)
    assert bench.kept_precisions(["fp32", "bf16"], "cpu", emulated_bf16=False) == ["fp32"]
    assert bench.kept_precisions(["fp32", "bf16"], "cpu", emulated_bf16=True) == ["fp32", "bf16"]
    assert bench.precision_label("bf16", "cpu") == "bf16 (emulated)"
    assert bench.precision_label("fp32", "cpu") == "fp32"
    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: True)
    assert bench.kept_precisions(["fp32", "bf16"], "cpu", emulated_bf16=False) == ["fp32", "bf16"]
    assert bench.precision_label("bf16", "cpu") == "bf16"


def test_bench_process_and_levers_skip_emulated_bf16_unless_asked(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    process, levers = _benchmark("bench_process"), _benchmark("bench_levers")
    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: False)
    assert process.kept_workloads(list(process.WORKLOADS), emulated_bf16=False) == \
        ["mini-fp32", "mini-v8192-fp32", "mini-v8192-m30-fp32", "transformers-mini-v8192-fp32"]
    assert process.kept_workloads(["mini-fp32"], emulated_bf16=False) == ["mini-fp32"]
    assert process.kept_workloads(list(process.WORKLOADS), True) == list(process.WORKLOADS)
    assert levers.runs_bf16(emulated_bf16=False) is False
    assert levers.runs_bf16(emulated_bf16=True) is True
    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: True)
    assert process.kept_workloads(list(process.WORKLOADS), False) == list(process.WORKLOADS)
    assert levers.runs_bf16(emulated_bf16=False) is True


def test_release_freed_memory_hands_kept_blocks_back():
    """200 MB freed in the middle of glibc's heap stays resident until trimmed: the block
    still in use above it keeps free() from shrinking the heap."""
    import ctypes

    from minibert.machine.memory import current_memory_mb, release_freed_memory

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 * 1024  # below glibc's mmap threshold: served from the heap
    blocks = [libc.malloc(size) for _ in range(3200)]
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in blocks[:-1]:
        libc.free(b)
    kept = current_memory_mb("cpu")
    assert release_freed_memory()
    released = current_memory_mb("cpu")
    libc.free(blocks[-1])
    assert kept - released > 100, (kept, released)


_KERNEL_CACHE_CHILD = """
import sys
import minibert.machine.memory
if sys.argv[1] != "none":
    print("set", minibert.machine.memory.limit_kernel_cache(int(sys.argv[1])), flush=True)
import torch
x, w = torch.randn(64, 48).bfloat16(), torch.randn(32, 48).bfloat16()
for _ in range(3):  # the same shape three times: one compile, then two cache hits
    torch.nn.functional.linear(x, w)
"""


@pytest.mark.parametrize("capacity, user, said, misses", [
    ("none", None, None, 1),  # oneDNN's default cache: compiled once, then found
    ("0", None, "set True", 3),  # the bound set in-process, before the first matmul, holds
    ("4", None, "set True", 1),
    ("4", "0", "set False", 3),  # a bound the user set in the environment is kept
])
def test_limit_kernel_cache_bounds_onednn_from_inside_the_process(capacity, user, said, misses):
    env = {k: v for k, v in os.environ.items()
           if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")}
    env["ONEDNN_VERBOSE"] = "profile_create"
    if user is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = user
    out = subprocess.run([sys.executable, "-c", _KERNEL_CACHE_CHILD, capacity], env=env,
                         capture_output=True, text=True, check=True).stdout
    creates = re.findall(r"create:cache_(miss|hit)", out)
    if not creates:
        pytest.skip("this torch build does not run CPU bf16 matmuls through oneDNN")
    assert (said is None) == ("set " not in out) and (said is None or said in out)
    assert creates.count("miss") == misses and len(creates) == 3, out


def test_limit_kernel_cache_refuses_a_negative_bound():
    with pytest.raises(ValueError, match="capacity=-1"):
        limit_kernel_cache(-1)
