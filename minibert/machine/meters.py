"""What a run measures about its own speed (docs/machine-room.md, §10): throughput, model
FLOPs utilisation (MFU), and its ceiling (`measure_peak_flops`, measured once per machine and
recorded by `mfu_ceiling`, said by `stated_ceiling`); the FLOPs of a step (`flops_per_token`,
`parameter_flops_per_token`), `mfu`, and `StepMeter`, the steps between two log rows.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import time
from pathlib import Path
from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from ..atomic import PathLike, write_files_atomically
from ..model.config import BertConfig
from .environment import cpu_name
from .memory import Device, peak_memory_mb, reset_peak_memory
from .precision import MATMUL_DTYPES
from ..data.tokenizer_train import default_cache_dir

CEILINGS_FILE = "mfu_ceilings.json"

logger = logging.getLogger(__name__)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (a GPU runs it after the call returns), so
    that a clock read next times it; nothing to wait for on a CPU."""
    module = getattr(torch, device.type, None) if device.type != "cpu" else None
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize(device)


def measure_peak_flops(device: Device, dtype: torch.dtype = torch.float32,
                       max_n: int = 4096, budget_s: float = 0.3) -> float:
    """Achievable matmul FLOP/s on `device` in `dtype`: the best rate of (n x n) @ (n x n)
    products (2 n^3 FLOPs), the least disturbed by other work. Bounded by time, as rates differ
    by orders of magnitude: n doubles from 128 (up to `max_n`) while a product takes under
    `budget_s / 8` (timed, as a busy machine spoils a prediction), then that size repeats until
    `budget_s`: about 2 x `budget_s` at most."""
    device = torch.device(device)
    # A private generator: measuring must not move the global RNG that training draws from.
    gen = torch.Generator(device=device).manual_seed(0)

    def matrices(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(n, n, device=device, generator=gen).to(dtype),
                torch.randn(n, n, device=device, generator=gen).to(dtype))

    def seconds(a: torch.Tensor, b: torch.Tensor) -> float:
        t0 = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        return max(time.perf_counter() - t0, 1e-9)

    n = 128
    a, b = matrices(n)
    torch.mm(a, b)  # warm-up: kernel selection, lazy initialisation, caches
    synchronize(device)
    start = time.perf_counter()
    last = seconds(a, b)
    while 2 * n <= max_n and last < budget_s / 8:
        n *= 2
        a, b = matrices(n)
        last = seconds(a, b)
    rates = [2.0 * n**3 / last]
    while time.perf_counter() - start < budget_s:
        rates.append(2.0 * n**3 / seconds(a, b))
    return max(rates)


class Ceiling(NamedTuple):
    """An MFU ceiling in FLOP/s, and where it came from, in words, for the run's log."""

    flops_per_s: float
    source: str


def machine_key(device: Device, dtype: torch.dtype) -> str:
    """What a matmul ceiling depends on, in words: a CPU's model name, vector width (one name may
    cover CPUs with and without bf16) and threads, or a GPU's name; the dtype; torch's version."""
    device = torch.device(device)
    if device.type == "cpu":
        where = (f"cpu {cpu_name()} ({torch.backends.cpu.get_cpu_capability()}, "
                 f"{torch.get_num_threads()} threads)")
    elif device.type == "cuda":
        where = f"cuda {torch.cuda.get_device_name(device)}"
    else:
        where = device.type
    return f"{where}, {str(dtype).removeprefix('torch.')}, torch {torch.__version__}"


def mfu_ceiling(device: Device, dtype: torch.dtype,
                cache_dir: Optional[PathLike] = None) -> Ceiling:
    """The matmul ceiling of this machine in `dtype`, measured once (a ceiling timed at every start
    would time the machine's other work too) by `measure_peak_flops`, recorded in
    `cache_dir`/mfu_ceilings.json (default `default_cache_dir()`) under `machine_key` and reused.
    Delete an entry to measure again. Where it cannot be recorded, the source says so."""
    path = (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / CEILINGS_FILE
    key = machine_key(device, dtype)
    try:  # a missing, damaged or unreadable record is measured again and written whole
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        records = {}
    records = records if isinstance(records, dict) else {}
    record = records.get(key)
    flops = record.get("flops_per_s") if isinstance(record, dict) else None
    if isinstance(flops, (int, float)) and math.isfinite(flops) and flops > 0:
        return Ceiling(float(flops),
                       f"measured on {record.get('measured', 'an earlier run')} and recorded "
                       f"in {path} for {key}; delete that entry to measure again")
    flops = measure_peak_flops(device, dtype, budget_s=1.0)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    records[key] = {"flops_per_s": flops, "measured": now}
    try:
        write_files_atomically(path.parent, {path.name: json.dumps(records, indent=2) + "\n"})
    except OSError as error:
        return Ceiling(flops, f"measured now; it could not be recorded in {path} ({error}), "
                              f"so the next run measures again")
    return Ceiling(flops, f"measured now and recorded in {path} for {key}, for every later "
                          f"run on this machine")


def stated_ceiling(peak_flops: Optional[float], device: Device, precision: str,
                   world_size: int = 1) -> float:
    """The MFU ceiling of a run's rows, FLOP/s of one rank, said in one line: `peak_flops` where
    given, else `mfu_ceiling`'s. Never measured again, so it does not move with the load."""
    if peak_flops:
        peak, source = peak_flops, "given as TrainConfig.peak_flops"
    else:
        peak, source = mfu_ceiling(device, MATMUL_DTYPES[precision])
    rate = f"{peak / 1e12:.4g} TFLOP/s" if peak >= 1e12 else f"{peak / 1e9:.4g} GFLOP/s"
    ranks = f" x {world_size} ranks" if world_size > 1 else ""
    logger.info("MFU ceiling: %s%s (%s matmuls), %s", rate, ranks, precision, source)
    return peak


def say_if_beaten(mfu: float) -> bool:
    """Warn that a row's MFU is above 1 (the caller does so once a run): the ceiling was
    measured low, on a busy machine. Not measured again: it would depend on the load."""
    if mfu > 1:
        logger.warning("MFU %.2f is above 1: the MFU ceiling stated at the start is below what "
                       "training reaches (measured while the machine was busy?); delete its "
                       "recorded entry to measure it again, or set TrainConfig.peak_flops", mfu)
    return mfu > 1


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the fraction of `peak_flops` that training turns into model
    FLOPs (`tokens_per_s * flops_per_token / peak_flops`, in [0, 1] for a sound peak)."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops={peak_flops!r} must be > 0")
    return tokens_per_s * flops_per_token / peak_flops


class StepMeter:
    """Tokens, seconds and model FLOPs of the steps since the last log row, their own time only (an
    evaluation or a save between two rows does not lower the next's throughput)."""

    def __init__(self) -> None:
        self.tokens, self.seconds, self.flops = 0, 0.0, 0.0

    def add(self, tokens: int, seconds: float, flops: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.flops += flops

    def flops_per_s(self) -> float:
        """The model FLOP/s of the steps since the last row."""
        return self.flops / max(self.seconds, 1e-9)

    def take(self, peak_flops: float, device: torch.device) -> dict[str, float]:
        """The window's numbers, then a new window. Tokens/s and the ceiling count every rank."""
        tps = self.tokens / max(self.seconds, 1e-9)
        row = {"tokens_per_s": round(tps, 1),
               "mfu": round(mfu(tps, self.flops / max(self.tokens, 1), peak_flops), 4),
               "peak_mem_mb": round(peak_memory_mb(device), 1)}
        self.__init__()
        reset_peak_memory(device)
        return row


def flops_per_token(config: BertConfig, seq_len: int,
                    mlm_fraction: Optional[float] = None) -> float:
    """Training FLOPs (forward + backward) per input token of BertForMaskedLM.

        6 * N  +  12 * L * H * T

    6 * N: a matmul parameter costs 2 FLOPs per token forward and 4 backward (Kaplan et al.
    2020, sec. 2.1). 12 * L * H * T: attention's Q K^T and P V, 4 * T * H per layer and token
    forward, times 3 with the backward (PaLM, Chowdhery et al. 2022, appendix B); a local layer
    meets min(T, 2 w + 1) keys. Embeddings, norms, activations and biases are ignored. N: per
    layer 4 H^2 + 2 H I (3 H I with GeGLU), and the MLM head's H^2 + V H, on the `mlm_fraction`
    of tokens a sparse head predicts (None: every token, a dense head). No pooler."""
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be a positive integer")
    if mlm_fraction is not None and not 0.0 <= mlm_fraction <= 1.0:
        raise ValueError(f"mlm_fraction={mlm_fraction!r} must be in [0, 1] (the fraction "
                         f"of tokens the MLM head predicts), or None for a dense head")
    L, H, I, V = (config.num_layers, config.hidden_size, config.intermediate_size,
                  config.vocab_size)
    ffn = 3 if config.mlp == "geglu" else 2
    n_encoder = L * (4 * H * H + ffn * H * I)
    n_head = H * H + V * H
    head_fraction = 1.0 if mlm_fraction is None else float(mlm_fraction)
    keys = sum(seq_len if config.window(i) is None else min(seq_len, 2 * config.window(i) + 1)
               for i in range(L))  # keys each query meets, summed over layers
    return 6.0 * (n_encoder + head_fraction * n_head) + 12.0 * H * keys


def matmul_weights(model: nn.Module) -> int:
    """The weights a token meets in a matmul: every parameter of two or more dimensions, once
    each, but `nn.Embedding` tables (a token reads one row and multiplies nothing)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in model.parameters()  # lists a shared tensor once
               if p.ndim >= 2 and id(p) not in tables)


def parameter_flops_per_token(model: nn.Module) -> float:
    """Training FLOPs (forward + backward) per input token of a model of your own without a
    BertConfig: 6 * N, N its `matmul_weights`. It misses attention's own 12 * L * H * T and a
    tied decoder's matmul (docs/runs.md, "A model of your own")."""
    return 6.0 * matmul_weights(model)
