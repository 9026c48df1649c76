#!/usr/bin/env bash
# Packs binaries built on a development machine without a GPU for a GPU machine that cannot
# build or install (scripts/gpu-check.sh's QWEN36_PREBUILT): qwen36, test_cuda_ops and
# test_cuda_tp of BUILD_DIR, with the shared libraries they load from this machine's Debian
# packages that the GPU machine may lack or have in other versions (spdlog, fmt, PCRE2,
# utf8proc, cpp-httplib and what it links), into build/prebuilt/ (git-ignored).
#   cmake -S . -B build/dev90 -G Ninja -DCMAKE_BUILD_TYPE=Release -DQWEN36_CUDA=ON \
#         -DCMAKE_CUDA_ARCHITECTURES=90a
#   ninja -C build/dev90 qwen36 test_cuda_ops test_cuda_tp [bench_host_experts test_quant]
#   scripts/pack-prebuilt.sh build/dev90
# On the GPU machine, from the repository root (build/prebuilt carried along):
#   source build/prebuilt/unpack.sh && scripts/gpu-check.sh OUT
# unpack.sh sets Q, T and TP to the three binaries, TRACE_LIB to the kernel-timeline library
# (tools/kernel_trace), HB and TQ to the optional CPU programs and QWEN36_PREBUILT for
# gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/dev90}
for f in src/cli/qwen36 tests/gpu/test_cuda_ops; do
  [ -x "$B/$f" ] || { echo "pack-prebuilt: $B/$f is missing; build it first (see the header)" >&2; exit 1; }
done
OUT=build/prebuilt
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/lib" "$OUT"
cp "$B/src/cli/qwen36" "$B/tests/gpu/test_cuda_ops" "$STAGE/"
LEAN=${QWEN36_PACK_LEAN:-0}
if [ "$LEAN" != 1 ] && [ -x "$B/tests/gpu/test_cuda_tp" ]; then cp "$B/tests/gpu/test_cuda_tp" "$STAGE/"; fi
# CPU-side programs worth running on the GPU machine's host, if built: the host expert pass
# benchmark (tools/host_experts_bench) and the quantized CPU kernels' tests (their AVX-512
# paths run only where the CPU has AVX-512, which a development machine may lack).
# QWEN36_PACK_LEAN=1 leaves them and test_cuda_tp out (a one-GPU call with the test fixtures).
for f in tools/host_experts_bench/bench_host_experts tests/unit/quant/test_quant; do
  if [ "$LEAN" != 1 ] && [ -x "$B/$f" ]; then cp "$B/$f" "$STAGE/"; fi
done
# The kernel-timeline library (tools/kernel_trace) with the CUPTI it was linked against.
TRACE=$B/tools/kernel_trace/libqwen36_kernel_trace.so
if [ -f "$TRACE" ]; then
  cp "$TRACE" "$STAGE/"
  ldd "$TRACE" | awk '/libcupti/ && /=> \//{print $3}' | while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
fi
# The non-system libraries the binaries load (the CUDA ones come with the GPU machine's toolkit).
for f in "$STAGE"/qwen36 "$STAGE"/test_*; do ldd "$f"; done |
  awk '/=> \//{print $3}' | grep -E 'spdlog|fmt|pcre2|utf8proc|httplib|ssl|crypto|brotli' | sort -u |
  while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
for f in "$STAGE"/qwen36 "$STAGE"/test_* "$STAGE"/bench_*; do if [ -f "$f" ]; then strip "$f"; fi; done
# xz -9e: the archive travels in a 64 MiB call (24 MB at the default level, ~14 at this one)
tar -C "$STAGE" -cf - . | xz -9e -T0 > "$OUT/qwen36-prebuilt.tar.xz"
cat > "$OUT/unpack.sh" <<'EOF'
# Sourced on the GPU machine from the repository root (scripts/pack-prebuilt.sh wrote it).
QWEN36_PREBUILT=${QWEN36_PREBUILT:-/tmp/qwen36-prebuilt}
mkdir -p "$QWEN36_PREBUILT" && tar -C "$QWEN36_PREBUILT" -xJf build/prebuilt/qwen36-prebuilt.tar.xz
export QWEN36_PREBUILT LD_LIBRARY_PATH="$QWEN36_PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export Q=$QWEN36_PREBUILT/qwen36 T=$QWEN36_PREBUILT/test_cuda_ops TP=$QWEN36_PREBUILT/test_cuda_tp
export TRACE_LIB=$QWEN36_PREBUILT/libqwen36_kernel_trace.so  # tools/kernel_trace, if it was built
export HB=$QWEN36_PREBUILT/bench_host_experts TQ=$QWEN36_PREBUILT/test_quant  # if they were built
EOF
echo "pack-prebuilt: $OUT/qwen36-prebuilt.tar.xz ($(du -h "$OUT/qwen36-prebuilt.tar.xz" | cut -f1)), $OUT/unpack.sh"
