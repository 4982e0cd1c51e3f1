"""What does unpadding buy on a padded fine-tuning batch?

`BertModel` runs every layer except attention on the real tokens only when a batch has
padding (MosaicBERT, ModernBERT). This script times a classification training step on a
batch with random lengths against the same model run the padded way, every layer on all
B x T positions, which is the reference forward defined below; the two are interleaved.

    python benchmarks/bench_unpadding.py                     # base, 16 x 128, fp32 and bf16
    python benchmarks/bench_unpadding.py --preset mini --batch-size 32

bf16 is skipped, with a note, on a CPU that emulates bf16 matmuls (no AMX or AVX512-BF16;
`minibert.machine.precision.cpu_bf16_native`), unless `--emulated-bf16` is passed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import minibert
import minibert.machine.precision
from minibert.model import model as M
from minibert.machine.precision import autocast_context


def kept_precisions(precisions: list[str], device: str, emulated_bf16: bool) -> list[str]:
    """The precisions to run: bf16 is left out where it is emulated, unless asked for."""
    if "bf16" in precisions and precision_label("bf16", device) != "bf16" and not emulated_bf16:
        print("bf16 skipped: this CPU emulates bf16 matmuls (no AMX or AVX512-BF16), far "
              "slower than fp32; --emulated-bf16 runs it anyway", file=sys.stderr)
        return [p for p in precisions if p != "bf16"]
    return list(precisions)


def precision_label(precision: str, device: str) -> str:
    emulated = (torch.device(device).type == "cpu"
                and not minibert.machine.precision.cpu_bf16_native())
    return f"{precision} (emulated)" if precision == "bf16" and emulated else precision


def padded_forward(self, input_ids, attention_mask=None, token_type_ids=None):
    """BertModel.forward without unpadding: every layer on all B x T positions."""
    keep = None if attention_mask is None else attention_mask.bool()
    x = self.embeddings(input_ids, token_type_ids)
    for block in self.blocks:
        x = block(x, keep)
    if self.final_norm is not None:
        x = self.final_norm(x)
    pooled = None if self.pooler is None else torch.tanh(self.pooler(x[:, 0]))
    return M.BertOutput(x, pooled)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="base")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--emulated-bf16", action="store_true",
                   help="run bf16 on a CPU that emulates it (very slow)")
    args = p.parse_args()
    args.precisions = kept_precisions(args.precisions, "cpu", args.emulated_bf16)

    g = torch.Generator().manual_seed(0)
    B, T = args.batch_size, args.seq_len
    lengths = torch.randint(args.min_len, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(5, 30000, (B, T), generator=g) * mask
    labels = torch.arange(B) % 3
    unpadded_forward = M.BertModel.forward
    print(f"{args.preset}, {B} x {T}, lengths uniform in [{args.min_len}, {T}]: "
          f"{1 - mask.float().mean():.0%} padding; classification step, `math` attention\n")
    print("| precision | padded s/step | unpadded s/step | speed-up |")
    print("|---|---|---|---|")
    for precision in args.precisions:
        runs = []
        for forward in (padded_forward, unpadded_forward):
            torch.manual_seed(0)
            model = minibert.fast(minibert.BertForSequenceClassification(
                minibert.BertConfig.preset(args.preset, attention="math"), 3)).train()
            runs.append((forward, model, torch.optim.AdamW(model.parameters(), fused=True), []))
        for _ in range(args.steps + 1):
            for forward, model, opt, times in runs:
                M.BertModel.forward = forward
                t0 = time.perf_counter()
                with autocast_context(precision, torch.device("cpu")):
                    loss = model(ids, mask, labels=labels).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - t0)
        M.BertModel.forward = unpadded_forward
        padded, unpadded = (statistics.median(r[3][1:]) for r in runs)
        print(f"| {precision_label(precision, 'cpu')} | {padded:.3f} | {unpadded:.3f} | "
              f"{padded / unpadded:.2f}x |")


if __name__ == "__main__":
    main()
