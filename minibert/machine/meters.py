"""What a run measures about its own speed: throughput, model FLOPs utilisation (MFU), and
the matmul ceiling MFU is a fraction of.

* `measure_peak_flops`: the achievable matmul rate of a device in a dtype, bounded in time.
* `mfu_ceiling`: that rate measured once per machine, recorded, and read back by every run;
  `stated_ceiling`: the one a run uses, said in its log.
* `flops_per_token`: a BertForMaskedLM step's model FLOPs per token (Kaplan et al. 2020);
  `parameter_flops_per_token`: a model of your own's, from its weight matrices alone.
* `mfu`: model FLOPs (`flops_per_token`) per second over that ceiling.
* `StepMeter`: the tokens, seconds and FLOPs of the steps between two log rows.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import time
from pathlib import Path
from typing import NamedTuple, Optional, Union

import torch
import torch.nn as nn

from ..atomic import PathLike, write_files_atomically
from ..model.config import BertConfig
from .environment import cpu_name
from .memory import peak_memory_mb, reset_peak_memory
from .precision import MATMUL_DTYPES
from ..data.tokenizer_train import default_cache_dir

Device = Union[str, torch.device]
# Where `mfu_ceiling` records each machine's ceilings, under `default_cache_dir()`
# ($MINIBERT_CACHE, else ~/.cache/minibert).
CEILINGS_FILE = "mfu_ceilings.json"

logger = logging.getLogger(__name__)


def _synchronize(device: torch.device) -> None:
    module = getattr(torch, device.type, None) if device.type != "cpu" else None
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize(device)


def measure_peak_flops(device: Device, dtype: torch.dtype = torch.float32,
                       max_n: int = 4096, budget_s: float = 0.3) -> float:
    """Achievable matmul FLOP/s on `device` in `dtype`: the MFU denominator, measured.

    Returns the best rate of square (n x n) @ (n x n) products (2 n^3 FLOPs each): a
    ceiling, and the rate least disturbed by whatever else runs on the machine at the time.
    This is what the hardware actually delivers on a large, well shaped matmul, usually
    somewhat below the datasheet peak; pass a datasheet number to `mfu` instead when
    comparing with published MFU figures.

    The cost is bounded by time, not by a fixed size, because rates differ by orders of
    magnitude between devices and dtypes: where a CPU emulates bf16, one 2048^3 product
    alone takes many seconds (benchmarks/RESULTS.md, its opening section on the machines).
    n starts at 128 and doubles, up to `max_n`, while one product takes under `budget_s / 8`
    (so the next, 8x the work, takes at most `budget_s`); products of the final size then
    repeat until `budget_s` has passed since the start. At most about 2 x `budget_s` in all,
    0.6 s at the default, on any device. Growing by the time taken rather than predicting it
    from the small sizes' rates matters on a busy machine, where a small multi-threaded
    product can wait longer for its threads to be scheduled than it takes to compute.
    """
    device = _device(device)
    # A private generator: measuring must not move the global RNG that training draws from.
    gen = torch.Generator(device=device).manual_seed(0)

    def matrices(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(n, n, device=device, generator=gen).to(dtype),
                torch.randn(n, n, device=device, generator=gen).to(dtype))

    def seconds(a: torch.Tensor, b: torch.Tensor) -> float:
        t0 = time.perf_counter()
        torch.mm(a, b)
        _synchronize(device)
        return max(time.perf_counter() - t0, 1e-9)

    n = 128
    a, b = matrices(n)
    torch.mm(a, b)  # warm-up: kernel selection, lazy initialisation, caches
    _synchronize(device)
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
    """What a matmul ceiling depends on, in words: the device (a CPU's model name and the
    widest vector instructions torch uses on it, with the threads it runs on; a GPU's name),
    the dtype and the torch version. A CPU's model name alone may cover CPUs with and
    without bf16 instructions ("AMD EPYC"), hence the vector width."""
    device = _device(device)
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
    """The matmul ceiling of this machine in `dtype`: measured once, recorded, then reused.

    A ceiling timed at the start of every run would time whatever else the machine is doing
    as well: low while other work shares it, so that one run logs a higher MFU on a busy
    machine than on a quiet one. So the first run on a machine measures it
    (`measure_peak_flops`, given a second) and records it in `cache_dir`/mfu_ceilings.json
    (default `default_cache_dir()`: $MINIBERT_CACHE, else ~/.cache/minibert) under
    `machine_key`; every later run reads that record back, and the source says where it came
    from. A ceiling measured while the machine was busy stays low until its entry is deleted
    (the next run measures again) or a run is given one (`TrainConfig.peak_flops`). Where the
    record cannot be written (a read-only home), the measurement serves this run alone, and
    the source says so.
    """
    path = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    path = path / CEILINGS_FILE
    key = machine_key(device, dtype)
    records = _read_records(path)
    record = records.get(key)
    if isinstance(record, dict) and _sound(record.get("flops_per_s")):
        return Ceiling(float(record["flops_per_s"]),
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
    """The MFU ceiling of a run's rows, FLOP/s of one rank, stated in one line: `peak_flops`
    where given, else this machine's recorded one (`mfu_ceiling`, measured by the first run
    here). Never measured again during the run, so the figure does not move with the load
    of the machine."""
    if peak_flops:
        peak, source = peak_flops, "given as TrainConfig.peak_flops"
    else:
        peak, source = mfu_ceiling(device, MATMUL_DTYPES[precision])
    rate = f"{peak / 1e12:.4g} TFLOP/s" if peak >= 1e12 else f"{peak / 1e9:.4g} GFLOP/s"
    ranks = f" x {world_size} ranks" if world_size > 1 else ""
    logger.info("MFU ceiling: %s%s (%s matmuls), %s", rate, ranks, precision, source)
    return peak


def say_if_beaten(mfu: float) -> bool:
    """Say that a row's MFU is above 1 (the caller says it once a run): its ceiling is below
    what training reaches, as a ceiling measured while the machine was busy is. Not measured
    again here: a new figure would then depend on the load at that moment."""
    if mfu > 1:
        logger.warning("MFU %.2f is above 1: the MFU ceiling stated at the start is below what "
                       "training reaches (measured while the machine was busy?); delete its "
                       "recorded entry to measure it again, or set TrainConfig.peak_flops", mfu)
    return mfu > 1


def _read_records(path: Path) -> dict:
    """The recorded ceilings, or none where the file is missing or unreadable (a damaged
    record is measured again and written whole)."""
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def _sound(flops: object) -> bool:
    return isinstance(flops, (int, float)) and math.isfinite(flops) and flops > 0


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the fraction of `peak_flops` that training turns into model
    FLOPs (`tokens_per_s * flops_per_token / peak_flops`, in [0, 1] for a sound peak)."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops={peak_flops!r} must be > 0")
    return tokens_per_s * flops_per_token / peak_flops


class StepMeter:
    """Tokens, seconds and model FLOPs of the steps since the last log row: throughput, MFU
    and peak memory. Only the steps' own time counts: an evaluation or a checkpoint save
    between two rows does not lower the throughput of the next."""

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


def _device(device: Device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


# ---- what a training step costs -------------------------------------------------------------

def flops_per_token(config: BertConfig, seq_len: int,
                    mlm_fraction: Optional[float] = None) -> float:
    """Training FLOPs (forward + backward) per input token of BertForMaskedLM.

        6 * N  +  12 * L * H * T

    The first term is Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", sec.
    2.1): a matmul parameter costs 2 FLOPs per token forward (a multiply and an add) and 4
    backward (gradients for the input and for the weight). The second term is attention
    itself, which has no parameters (PaLM, Chowdhery et al. 2022, appendix B): per layer
    and token, Q K^T and P V are each 2 * T * H FLOPs forward, 4 * T * H in all, times 3
    with the backward. Embedding lookups, LayerNorm, GELU, softmax and biases are ignored,
    as in both papers.

    N counts matmul weights only: per layer Q, K, V and output projections (4 H^2) and the
    feed-forward (2 H I, or 3 H I with GeGLU). A local (sliding-window) layer's query meets
    at most 2 w + 1 keys, so its attention term counts min(T, 2 w + 1) instead of T. The
    MLM head (transform H^2, decoder V H, the tied embedding matrix used as a matmul) runs
    on every token when `mlm_fraction` is None (dense head)
    and on that fraction of tokens only with minibert's sparse head (pass the masking
    probability, e.g. 0.15): counting it for every token would overstate the work done.
    The pooler is not used in pretraining and is not counted.
    """
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
    """The weights a token meets in a matmul: every parameter of two or more dimensions,
    each counted once (a tied matrix is one tensor), but the tables of `nn.Embedding`, of
    which a token reads one row and multiplies nothing."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in model.parameters()  # lists a shared tensor once
               if p.ndim >= 2 and id(p) not in tables)


def parameter_flops_per_token(model: nn.Module) -> float:
    """Training FLOPs (forward + backward) per input token of a model whose shape minibert
    cannot read, a model of your own without a BertConfig: 6 * N, N its matmul weights
    (`matmul_weights`), Kaplan et al.'s count as in `flops_per_token`.

    What it leaves out, so that an MFU computed from it reads low: attention's own term,
    12 * L * H * T per token, which has no parameters for a count to see (for BERT-base,
    about 3% of its FLOPs at T = 128 and 10% at T = 512); a tied decoder's matmul, whose
    matrix is an embedding table (`flops_per_token` counts it); and, as there, the work of
    LayerNorm, activations, softmax and biases. It counts every weight for every token,
    where a head that runs on some tokens only (a sparse MLM head) costs less: that part
    reads high.
    """
    return 6.0 * matmul_weights(model)
