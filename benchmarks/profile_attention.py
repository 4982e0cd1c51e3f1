"""Where one attention step's time goes: matmuls against everything else, for `math` and
`chunked`, from torch's profiler.

A CPU whose matmuls are faster (AMX runs bf16 matmuls several times faster than AVX-512
BF16 does) shortens only the matmul part, so the split says how `chunked / math` would
move there: with matmul times m and other times o, a CPU whose matmuls are r times faster
gives (o_c + m_c / r) / (o_m + m_m / r). That is a projection for a CPU not at hand, not a
measurement of it (benchmarks/RESULTS.md, "Attention backends: memory and time against
sequence length").

One layer's attention alone (hidden 256 = 4 heads x 64, batch 1, no padding), forward and
backward, after two warm-up steps; the tile is `BertConfig`'s default.

    python benchmarks/profile_attention.py --length 4096 --dtype bfloat16
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from minibert import BertConfig
from minibert.model.attention import attention

MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::matmul", "aten::addmm")


def split(backend: str, T: int, dtype: torch.dtype, chunk: int) -> tuple[float, float]:
    """(matmul seconds, other seconds) of one forward + backward, by the ops' self time."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, T, 64, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 4, T, 64, dtype=dtype)
    for _ in range(2):
        attention(q, k, v, None, backend, chunk_size=chunk).backward(grad)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        attention(q, k, v, None, backend, chunk_size=chunk).backward(grad)
    matmul = other = 0.0
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        if event.key in MATMUL_OPS:
            matmul += seconds
        else:
            other += seconds
    return matmul, other


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--speedups", type=float, nargs="+", default=[2.0, 3.5],
                   help="matmul speed-ups r to project chunked / math for")
    args = p.parse_args()
    dtype, chunk = getattr(torch, args.dtype), BertConfig().attention_chunk_size
    parts = {b: split(b, args.length, dtype, chunk) for b in ("math", "chunked")}
    print(f"T = {args.length}, {args.dtype}, tile {chunk}\n")
    print("| backend | matmul s | other s | matmul share |\n|---|---|---|---|")
    for backend, (m, o) in parts.items():
        print(f"| {backend} | {m:.3f} | {o:.3f} | {m / (m + o):.0%} |")
    (m_m, o_m), (m_c, o_c) = parts["math"], parts["chunked"]
    print(f"\nchunked / math here, by the profile: {(m_c + o_c) / (m_m + o_m):.2f}")
    for r in args.speedups:
        print(f"projected where matmuls are {r:g}x faster: "
              f"{(o_c + m_c / r) / (o_m + m_m / r):.2f}")


if __name__ == "__main__":
    main()
