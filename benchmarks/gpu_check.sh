#!/usr/bin/env bash
# The GPU checks, one script that ends within about 8 minutes on one large GPU:
#   1. tests/test_cuda.py: fp16 with a real GradScaler and a NaN step, CUDA peak memory,
#      SDPA's flash kernel, chunked attention on CUDA, a real out-of-memory error, reported
#      and recovered by auto_micro_batch;
#   2. bf16 MFU on base at seq 128 as the engine logs it, against the H200's datasheet
#      dense-bf16 peak (989 TFLOP/s; goal >= 50%), with the measured matmul ceiling beside it;
#   3. minibert against transformers, base, bf16, seq 128 and 512;
#   4. chunked against math attention at T = 4096, with the tile picked on the device.
#
#     bash benchmarks/gpu_check.sh [RESULTS_DIR]     # default benchmarks/out/gpu
#
# It runs as it is on a bare CUDA machine with torch, transformers, tokenizers and pytest
# preinstalled: it calls python3 (no `python` alias needed), puts this checkout on PYTHONPATH
# instead of installing it, installs nothing and needs no network. Each check has its own
# time limit, and one failing does not stop the others; the exit status is 1 if any failed.
# Without a CUDA device it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${1:-benchmarks/out/gpu}"
# stdout only: a warning that importing torch prints on stderr must not hide the answer.
if ! found=$(python3 -c "import torch; print(torch.cuda.is_available())" 2>/tmp/gpu_check.$$); then
    echo "gpu_check: python3 cannot import torch: $(tail -n 1 /tmp/gpu_check.$$)" >&2
    rm -f /tmp/gpu_check.$$
    exit 1
fi
rm -f /tmp/gpu_check.$$
if [ "$found" != "True" ]; then
    echo "gpu_check: no CUDA device visible to torch; nothing to do."
    exit 0
fi
mkdir -p "$out"
status=0

check() {  # check NAME SECONDS COMMAND...: output to the screen and $out/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s): $*"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "== $name FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ', timed out'))"
        status=1
    fi
}

check device 30 python3 -c "import torch, transformers; d = torch.cuda.get_device_properties(0); \
print(f'{d.name}, {d.total_memory / 2**30:.0f} GiB, capability {d.major}.{d.minor}; torch \
{torch.__version__}, CUDA {torch.version.cuda}, transformers {transformers.__version__}')"
check tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py
check mfu 90 python3 benchmarks/bench_engine_overhead.py --device cuda --preset base \
    --precision bf16 --batch-size 128 --seq-len 128 --steps 30 --rounds 1 --log-every 10 \
    --peak-flops 989e12
check vs_transformers 120 python3 benchmarks/bench_vs_transformers.py --device cuda \
    --configs base base512 --precisions bf16 --steps 10 --no-memory --out "$out"
check attention 110 python3 benchmarks/bench_attention.py --device cuda --lengths 4096 \
    --chunk-size auto --out "$out"
exit $status
