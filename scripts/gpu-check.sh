#!/usr/bin/env bash
# On the GPU machine: build the CUDA preset for sm_90a only (ninja -j16), run the GPU tests
# and the standard benchmark set, and write every log to OUTDIR.
#   scripts/gpu-check.sh OUTDIR [--quick]
set -uo pipefail
OUT=${1:?usage: scripts/gpu-check.sh OUTDIR [--quick]}
QUICK=${2:-}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
BUILD=build/gpu-check
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
git log -1 --format='%H %s' > "$OUT/commit.txt" 2>/dev/null || true
git status --short >> "$OUT/commit.txt" 2>/dev/null || true

{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQWEN36_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
  cmake --build "$BUILD" -j16 --target qwen36 test_cuda_ops; } 2>&1 | tail -40 > "$OUT/build.log"
[ -x "$BUILD/src/cli/qwen36" ] || { echo "build failed, see $OUT/build.log"; exit 1; }

timeout 150 "$BUILD/tests/gpu/test_cuda_ops" 2>&1 | tee "$OUT/test_cuda_ops.log" | grep -E "^\[  (PASSED|FAILED) |FAILED|^\[ (gemv|[a-z-]+) \]" 
Q=$BUILD/src/cli/qwen36
bench() { echo "## qwen36 bench $*" | tee -a "$OUT/bench.md"; timeout 200 "$Q" bench --backend cuda "$@" 2>&1 | tee -a "$OUT/bench.md"; echo | tee -a "$OUT/bench.md"; }
if [ "$QUICK" = "--quick" ]; then
  bench --synthetic qwen3.6-27b --type bf16 -p 512 -n 32 -b 1 -r 2
else
  bench --synthetic qwen3.6-27b --type bf16 -p 512,4096 -n 128 -b 1,8,32 -r 3
  bench --synthetic qwen3.6-35b-a3b --type bf16 -p 4096 -n 128 -b 1,8 -r 3
fi
# Per-op GPU time of one decode step (eager launches, events around every op; no graphs).
for m in qwen3.6-27b qwen3.6-35b-a3b; do
  QWEN36_PROFILE=1 timeout 150 "$Q" bench --backend cuda --synthetic $m --type bf16 -p "" -n 16 -b 1 -r 1 \
    > "$OUT/profile-$m.md" 2>&1
done
