"""Where a training step spends its time, minibert beside transformers, by torch.profiler.

One step = forward with labels, backward, fused AdamW, under the precision asked for, on
one batch of random tokens; both libraries get the same weights (one random transformers
checkpoint, loaded by minibert). The profiler's self time per operator is grouped into
what the step does (matmuls, autocast casts, LayerNorm, the loss, the optimizer, ...), per
step, the median of `--steps` profiled steps after two warm-up steps.

    python benchmarks/profile_step.py --config mini     # the main job's step: 32 x 128, 30%
    python benchmarks/profile_step.py --config base     # BERT-base, 8 x 128, 15%, dropout 0.1

The last line is the cap that the matmuls put on minibert's lead: if every other operator
of minibert's step took no time at all, the step would still take its matmul time, so the
ratio can be at most transformers' step over minibert's matmuls. (Profiling adds a cost per
operator call, so its step times are above the unprofiled ones; the shares are what count.)

`--config mini` is the main job's step: vocabulary 8,192, 30% of positions masked, no
dropout, minibert's sparse head and `math` attention (its fastest at 128 positions in bf16
on a CPU). `--config base` is `bench_vs_transformers.py`'s base step: vocabulary 30,522, 15%
masked, dropout 0.1, `sdpa`. Skips cleanly (exit 0) when transformers is not installed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

import minibert
from minibert.machine.precision import autocast_context
from minibert.machine.memory import keep_freed_memory

CONFIGS = {  # name: (preset, batch, seq_len, vocab, masked share, dropout, minibert attention)
    "mini": ("mini", 32, 128, 8192, 0.3, 0.0, "math"),
    "base": ("base", 8, 128, 30522, 0.15, 0.1, "sdpa"),
}

# Operators by what they do for the step; the rest is "other".
GROUPS = {
    "matmuls": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
                "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "autocast casts and copies": ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone",
                                  "aten::contiguous"),
    "LayerNorm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
    "softmax and the loss": ("aten::_softmax", "aten::_softmax_backward_data",
                             "aten::_log_softmax", "aten::_log_softmax_backward_data",
                             "aten::nll_loss_forward", "aten::nll_loss_backward",
                             "aten::cross_entropy_loss"),
    "GELU": ("aten::gelu", "aten::gelu_backward"),
    "dropout": ("aten::bernoulli_", "aten::random_", "aten::native_dropout",
                "aten::native_dropout_backward", "aten::where", "aten::bitwise_and",
                "aten::ge", "aten::lt"),
    "embeddings (lookup and its gradient)": ("aten::embedding", "aten::index_select",
                                             "aten::embedding_dense_backward",
                                             "aten::embedding_backward", "aten::index_add_",
                                             "aten::index_put_", "aten::_index_put_impl_"),
    "optimizer (fused AdamW) and zeroing": ("aten::_fused_adamw_", "aten::fill_",
                                            "aten::zero_", "aten::zeros_like"),
    "elementwise add / mul / div": ("aten::add", "aten::add_", "aten::mul", "aten::mul_",
                                    "aten::div", "aten::div_", "aten::sub", "aten::rsub"),
    "memory (empty, resize)": ("aten::empty", "aten::empty_strided", "aten::resize_",
                               "aten::empty_like"),
}


def checkpoint(name: str, path: Path) -> None:
    import transformers

    preset, _, _, vocab, _, dropout, _ = CONFIGS[name]
    c = minibert.BertConfig.preset(preset)
    hc = transformers.BertConfig(vocab_size=vocab, hidden_size=c.hidden_size,
                                 num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                                 intermediate_size=c.intermediate_size,
                                 hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    transformers.BertForMaskedLM(hc).save_pretrained(path)


def batch(name: str) -> dict:
    _, B, T, vocab, share, _, _ = CONFIGS[name]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    labels = torch.full_like(ids, -100)
    pick = torch.rand(B, T, generator=g) < share
    labels[pick], ids[pick] = ids[pick], 4  # [MASK]
    return dict(input_ids=ids, attention_mask=torch.ones(B, T, dtype=torch.long), labels=labels)


def profile_steps(model, data: dict, precision: str, steps: int) -> tuple[float, dict]:
    """(median step ms, {group: median ms per step}) over `steps` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        with autocast_context(precision, torch.device("cpu")):
            loss = model(**data).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    totals, per_group = [], defaultdict(list)
    for _ in range(steps):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        self_ms = {e.key: e.self_cpu_time_total / 1000 for e in prof.key_averages()}
        totals.append(sum(self_ms.values()))
        grouped = defaultdict(float)
        for op, ms in self_ms.items():
            grouped[next((g for g, ops in GROUPS.items() if op in ops), "other")] += ms
        for g in (*GROUPS, "other"):
            per_group[g].append(grouped[g])
    return statistics.median(totals), {g: statistics.median(v) for g, v in per_group.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=list(CONFIGS), default="mini")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--keep-freed-memory", action="store_true",
                   help="minibert.machine.memory.keep_freed_memory() first, for both libraries")
    args = p.parse_args()
    try:
        import transformers
    except ImportError:
        print("transformers is not installed (pip install -e '.[examples]'): skipped")
        return
    if args.keep_freed_memory:
        keep_freed_memory()
    _, B, T, vocab, share, dropout, attention = CONFIGS[args.config]
    data = batch(args.config)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint(args.config, Path(tmp))
        models = {
            "minibert": minibert.fast(minibert.BertForMaskedLM.from_pretrained(
                tmp, attention=attention)),
            "transformers": transformers.BertForMaskedLM.from_pretrained(
                tmp, attn_implementation="sdpa"),
        }
    results = {name: profile_steps(m.train(), data, args.precision, args.steps)
               for name, m in models.items()}
    print(f"\n{args.config}: batch {B} x {T}, vocabulary {vocab}, {share:.0%} masked, dropout "
          f"{dropout}, {args.precision}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}; profiler self time, ms per step (median of "
          f"{args.steps})\n")
    print("| operators | minibert ms | share | transformers ms | share |")
    print("|---|---|---|---|---|")
    for g in (*GROUPS, "other"):
        cells = [f"{results[n][1][g]:.1f} | {results[n][1][g] / results[n][0]:.0%}"
                 for n in models]
        print(f"| {g} | " + " | ".join(cells) + " |")
    print("| **the step** | " + " | ".join(f"**{results[n][0]:.1f}** | 100%" for n in models)
          + " |")
    ours, theirs = results["minibert"], results["transformers"]
    print(f"\nprofiled step: transformers / minibert = {theirs[0] / ours[0]:.2f}x; "
          f"the cap with minibert's matmuls alone: {theirs[0] / ours[1]['matmuls']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
