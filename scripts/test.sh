#!/usr/bin/env bash
# The project's test command (CI runs exactly this through .ci/run):
#   1. installs the Debian packages and fetches the test tokenizer (scripts/setup.sh);
#   2. builds everything — with the cuda preset when nvcc is present, so the CUDA backend and
#      its tests compile too (GPU tests skip without a GPU; scripts/gpu-check.sh runs them on
#      a GPU machine), else the cpu preset — and runs every test with ctest;
#   3. rebuilds the untrusted-input suites (safetensors, config, GGUF) under AddressSanitizer
#      + UBSan and runs them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs="${QWEN36_JOBS:-$(nproc)}"

scripts/setup.sh

preset=cpu
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
  preset=cuda
fi
echo "== $preset build + tests"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"

echo "== asan: untrusted-input suites"
cmake --preset asan >/dev/null
asan_targets=(test_format test_gguf)
cmake --build --preset asan -j "$jobs" --target "${asan_targets[@]}"
for t in "${asan_targets[@]}"; do
  bin=$(find build/asan/tests -type f -name "$t" | head -n 1)
  echo "-- $t under ASan + UBSan"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$bin" --gtest_brief=1
done

echo "== $preset tests"
# ctest runs test binaries side by side; idle OpenMP threads must sleep, not spin, or two
# binaries on two cores slow each other down many times over.
export OMP_WAIT_POLICY=PASSIVE
ctest --preset "$preset" -j "$jobs" --timeout 900
