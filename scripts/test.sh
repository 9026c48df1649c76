#!/usr/bin/env bash
# The project's test command (CI runs exactly this through .ci/run):
#   1. installs the Debian packages and fetches the test tokenizer (scripts/setup.sh);
#   2. builds everything — with the cuda preset when nvcc is present, so the CUDA backend and
#      its tests compile too (GPU tests skip without a GPU; scripts/gpu-check.sh runs them on
#      a GPU machine), else the cpu preset — and runs every test with ctest;
#      the device code is compiled for sm_80 and sm_90a only (QWEN36_TEST_CUDA_ARCHS): those
#      are its two code paths (Hopper-only instructions sit behind __CUDA_ARCH__ >= 900;
#      sm_86 / 89 / 120 compile the same source as sm_80), and all five of the cuda preset's
#      architectures took CI past its 30 minutes on 2 cores (the build is ~2/3 device code);
#      sm_80 only to PTX (80-virtual: the whole front end and its warnings, no ptxas), since the
#      two full paths reached 1,749 of CI's 1,800 seconds in session 15;
#   3. rebuilds the untrusted-input suites (safetensors, config, GGUF) under AddressSanitizer
#      + UBSan (at -O0) and runs them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs="${QWEN36_JOBS:-$(nproc)}"

scripts/setup.sh

preset=cpu
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
  preset=cuda
fi
echo "== $preset build + tests ($(date +%T))"
if [ "$preset" = cuda ]; then
  cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES="${QWEN36_TEST_CUDA_ARCHS:-80-virtual;90a-real}" >/dev/null
else
  cmake --preset cpu >/dev/null
fi
cmake --build --preset "$preset" -j "$jobs"

echo "== asan: untrusted-input suites ($(date +%T))"
# At -O0 (the preset's -O1 for developers): the build recompiles all of qwen36lib for these two
# binaries, 4.3 instead of ~7 minutes on 2 cores, and they still run in seconds.
cmake --preset asan -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG" >/dev/null
asan_targets=(test_format test_gguf)
cmake --build --preset asan -j "$jobs" --target "${asan_targets[@]}"
for t in "${asan_targets[@]}"; do
  bin=$(find build/asan/tests -type f -name "$t" | head -n 1)
  echo "-- $t under ASan + UBSan"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$bin" --gtest_brief=1
done

echo "== $preset tests ($(date +%T))"
# ctest runs test binaries side by side; idle OpenMP threads must sleep, not spin, or two
# binaries on two cores slow each other down many times over.
export OMP_WAIT_POLICY=PASSIVE
ctest --preset "$preset" -j "$jobs" --timeout 900
