"""Inference on real text: minibert's `BertModel` against transformers' `BertModel` (SDPA
attention, its default) on the same weights, encoding WikiText.

The lines of WikiText-2's valid split, in file order (headings and blank lines left out),
are tokenized by a WordPiece vocabulary trained on them, truncated to 512 tokens, and cut
into batches of 32, each padded to its longest line: the padding of a real inference batch,
where minibert's unpadding skips the work of the padding tokens. Both models encode every
batch under `torch.inference_mode()`, the two taking turns batch by batch so that a change
in the machine's speed falls on both; each side's total time is summed over the batches,
after a warm-up pass over the first few. bf16 is the model's weights in bf16
(`from_pretrained(dtype=torch.bfloat16)` in both libraries), run only where the CPU has bf16
matrix instructions (`minibert.machine.precision.cpu_bf16_native`). The outputs are compared too,
at the real tokens.

    python benchmarks/bench_inference.py                            # mini and base, fp32 and bf16
    python benchmarks/bench_inference.py --presets mini --batches 20
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "valid.txt"


def wikitext_lines(path: Path) -> list[str]:
    """The text lines of a WikiText file in file order: no blank lines, no `= headings =`."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line and not line.startswith("=")]


def batches(tok, lines: list[str], batch: int, max_len: int, n: int) -> list[dict]:
    """The first `n` batches of `batch` lines each, padded to their longest (as
    `tok(..., padding=True)` pads)."""
    out = []
    for i in range(0, min(len(lines), n * batch), batch):
        enc = tok(lines[i:i + batch], padding=True, truncation=True, max_length=max_len,
                  return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                    "token_type_ids": enc["token_type_ids"]})
    return out


def compare(preset: str, dtype: torch.dtype, data: list[dict], warmup: int) -> dict:
    import transformers

    import minibert

    torch.manual_seed(0)
    config = minibert.BertConfig.preset(preset, vocab_size=30522)
    with tempfile.TemporaryDirectory() as d:
        minibert.BertModel(config).save_pretrained(d)
        ours = minibert.BertModel.from_pretrained(d, dtype=dtype).eval()
        theirs = transformers.BertModel.from_pretrained(d, dtype=dtype,
                                                        attn_implementation="sdpa").eval()
    spent = {"minibert": 0.0, "transformers": 0.0}
    worst = 0.0
    with torch.inference_mode():
        for i, b in enumerate(data[:warmup] + data):
            timed = i >= warmup
            for name, model in (("minibert", ours), ("transformers", theirs)):
                t = time.perf_counter()
                h = model(**b).last_hidden_state
                if timed:
                    spent[name] += time.perf_counter() - t
                if name == "minibert":
                    a = h
            keep = b["attention_mask"].bool()
            worst = max(worst, (a[keep].float() - h[keep].float()).abs().max().item())
    tokens = sum(int(b["attention_mask"].sum()) for b in data)
    padded = sum(b["attention_mask"].numel() for b in data)
    return {"preset": preset, "dtype": str(dtype).removeprefix("torch."),
            "batches": len(data), "real_tokens": tokens, "padded_tokens": padded,
            "minibert_s": spent["minibert"], "transformers_s": spent["transformers"],
            "speedup": spent["transformers"] / spent["minibert"], "max_abs_diff": worst}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["mini", "base"])
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--batches", type=int, default=40, help="batches of --batch-size lines")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--warmup", type=int, default=3, help="batches encoded before the clock")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: nothing to compare against", file=sys.stderr)
        return
    import minibert
    from minibert.machine.precision import cpu_bf16_native

    lines = wikitext_lines(args.data)
    tok = minibert.Tokenizer.train_from_iterator(lines, vocab_size=30522, use_cache=False)
    data = batches(tok, lines, args.batch_size, args.max_len, args.batches)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if "bf16" in args.dtypes and not cpu_bf16_native():
        print("bf16 skipped: this CPU emulates bf16 matmuls", file=sys.stderr)
        args.dtypes = [d for d in args.dtypes if d != "bf16"]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| preset | dtype | batches | real / padded tokens | minibert (s) | transformers (s) "
          "| transformers / minibert | max diff |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for preset in args.presets:
        for name in args.dtypes:
            r = compare(preset, dtypes[name], data, args.warmup)
            rows.append(r)
            print(f"| {preset} | {name} | {r['batches']} | "
                  f"{r['real_tokens'] / r['padded_tokens']:.0%} | {r['minibert_s']:.2f} | "
                  f"{r['transformers_s']:.2f} | **{r['speedup']:.2f}x** | "
                  f"{r['max_abs_diff']:.1e} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
