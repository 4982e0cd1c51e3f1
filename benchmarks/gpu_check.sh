#!/usr/bin/env bash
# The GPU checks, in one script that fits in about 8 minutes on one large GPU:
#   1. the CUDA-only tests (fp16 + GradScaler, CUDA peak memory, SDPA's flash kernel,
#      chunked attention on CUDA, a real out-of-memory error);
#   2. bench_train.py and bench_vs_transformers.py in bf16 at base size, seq 128 and 512.
# Results land in benchmarks/out/gpu/. Without a CUDA device it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; nothing to do."
    exit 0
fi
out=benchmarks/out/gpu
mkdir -p "$out"
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" \
    | tee "$out/device.txt"
status=0
python -m pytest -q tests/test_cuda.py 2>&1 | tee "$out/tests.txt" || status=1
python benchmarks/bench_train.py --device cuda --preset base --batch-size 32 --seq-len 128 \
    --steps 10 --out "$out" 2>/dev/null | tee "$out/train_128.md" || status=1
python benchmarks/bench_train.py --device cuda --preset base --batch-size 16 --seq-len 512 \
    --steps 10 --out "$out/seq512" 2>/dev/null | tee "$out/train_512.md" || status=1
python benchmarks/bench_vs_transformers.py --device cuda --configs base base512 \
    --precisions bf16 --steps 10 --out "$out" 2>/dev/null | tee "$out/vs_transformers.md" \
    || status=1
exit $status
