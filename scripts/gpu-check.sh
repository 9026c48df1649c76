#!/usr/bin/env bash
# On the GPU machine: build the CUDA preset for sm_90a only (ninja -j16), run the GPU tests
# and the standard benchmark set, and write every log to OUTDIR.
#   scripts/gpu-check.sh OUTDIR [--quick]        (QWEN36_PREBUILT=DIR: run binaries built elsewhere)
# QWEN36_CHECK_PARTS picks parts (default all): tests decode bench serve profiles trace offload tp
# — e.g. calls of a time-limited runner: "tests decode", then "bench", then "serve profiles", then
# "offload", and on a machine with two GPUs "tp". "decode" is the decode bars' table in about two
# minutes (one-token and small-batch steps of the four synthetic models, MTP SIMULATED): run it
# with every change, since a change for one model's step can cost another's.
set -uo pipefail
PARTS=" ${QWEN36_CHECK_PARTS:-tests decode bench serve profiles trace offload tp} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${1:?usage: scripts/gpu-check.sh OUTDIR [--quick]}
QUICK=${2:-}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
BUILD=build/gpu-check
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
git log -1 --format='%H %s' > "$OUT/commit.txt" 2>/dev/null || true
git status --short >> "$OUT/commit.txt" 2>/dev/null || true

# QWEN36_PREBUILT=DIR: use DIR/qwen36, DIR/test_cuda_ops and DIR/test_cuda_tp built elsewhere
# (sm_90a), with any shared libraries they need in DIR/lib, instead of building here.
if [ -n "${QWEN36_PREBUILT:-}" ]; then
  export LD_LIBRARY_PATH="$QWEN36_PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # the tests read fixtures under the source path they were built in (QWEN36_TEST_DATA)
  src=$(strings "$QWEN36_PREBUILT/test_cuda_ops" | grep -m1 -o '^/[^ ]*/tests/data$' || true)
  if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "${src%/tests/data}")" && ln -sfn "$PWD" "${src%/tests/data}"; fi
  Q=$QWEN36_PREBUILT/qwen36 TESTS=$QWEN36_PREBUILT/test_cuda_ops TP_TESTS=$QWEN36_PREBUILT/test_cuda_tp
  TRACE_LIB=$QWEN36_PREBUILT/libqwen36_kernel_trace.so
else
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQWEN36_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
    cmake --build "$BUILD" -j16 --target qwen36 test_cuda_ops test_cuda_tp &&
    { ! grep -q qwen36_kernel_trace "$BUILD/build.ninja" || cmake --build "$BUILD" --target qwen36_kernel_trace; }; } 2>&1 |
    tail -40 > "$OUT/build.log"
  [ -x "$BUILD/src/cli/qwen36" ] || { echo "build failed, see $OUT/build.log"; exit 1; }
  Q=$BUILD/src/cli/qwen36 TESTS=$BUILD/tests/gpu/test_cuda_ops TP_TESTS=$BUILD/tests/gpu/test_cuda_tp
  TRACE_LIB=$BUILD/tools/kernel_trace/libqwen36_kernel_trace.so
fi

# Each test suite in its own process: a kernel fault in one leaves the others' results intact.
: > "$OUT/tests.log"
part tests && for suite in $("$TESTS" --gtest_list_tests | grep -v '^ ' | grep '\.$' | tr -d '.'); do
  echo "=== $suite" >> "$OUT/tests.log"
  timeout 240 "$TESTS" --gtest_filter="$suite.*" >> "$OUT/tests.log" 2>&1
  echo "=== $suite rc=$?" | tee -a "$OUT/tests.log"
done
part tests && grep -E "^\[  (PASSED|FAILED) |Failure|^\[ [a-z0-9-]+ \]" "$OUT/tests.log"

bench() { echo "## qwen36 bench $*" | tee -a "$OUT/bench.md"; timeout 300 "$Q" bench --backend cuda "$@" 2>&1 | tee -a "$OUT/bench.md"; echo | tee -a "$OUT/bench.md"; }
if part decode; then
  for mt in "qwen3.6-27b bf16" "qwen3.6-35b-a3b bf16" "qwen3.6-27b q4_k_m" "qwen3.6-35b-a3b q4_k_m"; do
    set -- $mt
    bench --synthetic "$1" --type "$2" -p "" -n 64 -r 2 -b 1,4
  done
  bench --synthetic qwen3.6-27b --type q4_k_m -p "" -n 32 -r 2 -b 16
  bench --synthetic qwen3.6-27b --type q4_k_m -p "" -n 64 -r 2 -b 1 --spec mtp --spec-draft-n 3 \
    --simulate-acceptance 0.92,0.84,0.65,0.5,0.4
fi
if ! part bench; then
  :
elif [ "$QUICK" = "--quick" ]; then
  bench --synthetic qwen3.6-27b --type bf16 -p 512 -n 32 -b 1 -r 2
else
  bench --synthetic qwen3.6-27b --type bf16 -p 512,4096 -n 128 -b 1,8,32 -r 3
  bench --synthetic qwen3.6-35b-a3b --type bf16 -p 4096 -n 128 -b 1,8 -r 3
  bench --synthetic qwen3.6-27b --type q4_k_m -p 512,4096 -n 128 -b 1,8,16,32 -r 3
  bench --synthetic qwen3.6-35b-a3b --type q4_k_m -p 4096 -n 128 -b 1,8,16,32,64 -r 3
  # Hugging Face formats (issue 6): AWQ-like W4 g128 and NVFP4 decode, FP8 prefill
  bench --synthetic qwen3.6-27b --type awq -p 512 -n 64 -b 1 -r 2
  bench --synthetic qwen3.6-27b --type nvfp4 -p 512 -n 64 -b 1 -r 2
  bench --synthetic qwen3.6-27b --type fp8 -p 4096 -n 32 -b 1 -r 2
  # DFlash chain (issue 9), random drafter of the published shape, SIMULATED accept length
  bench --synthetic qwen3.6-27b --type q4_k_m -p "" -n 64 -b 1 -r 2 --spec dflash --spec-draft-n 15 \
    --simulate-accept-length 6
  # DDTree (issue 9), budget 22: a tree verify pass's DeltaNet layers in two launches each (the
  # fused tree op, session 52), its 23-token GEMMs in the bf16 form (session 53), SIMULATED acceptance
  bench --synthetic qwen3.6-27b --type q4_k_m -p "" -n 64 -b 1 -r 2 --spec dflash --spec-draft-n 15 \
    --tree-budget 22 --simulate-accept-length 9
  # the same with the tree ops composed (QWEN36_TREE_FUSED=off) and with the 17-32-token GEMMs in
  # the int8 form (QWEN36_MMA_HB=off): the A / B of bench/RESULTS.md, session 53
  echo "## (the next run with QWEN36_TREE_FUSED=off)" | tee -a "$OUT/bench.md"
  QWEN36_TREE_FUSED=off bench --synthetic qwen3.6-27b --type q4_k_m -p "" -n 64 -b 1 -r 2 --spec dflash \
    --spec-draft-n 15 --tree-budget 22 --simulate-accept-length 9
  echo "## (the next run with QWEN36_MMA_HB=off)" | tee -a "$OUT/bench.md"
  QWEN36_MMA_HB=off bench --synthetic qwen3.6-27b --type q4_k_m -p "" -n 64 -b 1 -r 2 --spec dflash \
    --spec-draft-n 15 --tree-budget 22 --simulate-accept-length 9
  # speculative decoding (issue 8): real MTP draft / verify / commit kernels, SIMULATED accept
  # decisions (per-position probabilities; the last one repeats), labelled so in every line
  bench --synthetic qwen3.6-27b --type q4_k_m -p "" -n 128 -b 1,8 -r 2 --spec mtp --spec-draft-n 1,2,3,4,5 \
    --simulate-acceptance 0.92,0.84,0.65,0.5,0.4
  for kv in bf16 ${QWEN36_KV_TYPES:-}; do
    bench --synthetic qwen3.6-27b --type bf16 -p "" -n 32 -d 32768 -b 1 -r 2 -ctk $kv -ctv $kv
  done
fi
# Serving (issue 7): S concurrent streams through the continuous-batching engine, 512-token
# prompts, 128 generated; the serve defaults (chunked prefill mixed with decode).
if [ "$QUICK" != "--quick" ] && part serve; then
  : > "$OUT/serve.md"
  for m in qwen3.6-27b qwen3.6-35b-a3b; do
    echo "## qwen36 bench-serve $m q4_k_m" >> "$OUT/serve.md"
    timeout 400 "$Q" bench-serve --backend cuda --synthetic $m --type q4_k_m --streams 1,4,16,64 \
      --prompt-tokens 512 --gen-tokens 128 --rounds 2 >> "$OUT/serve.md" 2>&1
  done
fi
# Per-op GPU time of one decode step and of one 4096-token prefill (eager launches, events
# around every op; no graphs), all in one file.
: > "$OUT/profiles.md"
part profiles && for m in qwen3.6-27b qwen3.6-35b-a3b; do
  # prefill: 3 timed passes after the warm-up, so first-use costs (module loading, pool
  # growth) weigh a quarter in the averages
  for shape in '-p "" -n 16 -r 1' '-p 4096 -n "" -r 3'; do
    echo "## $m $shape" >> "$OUT/profiles.md"
    eval QWEN36_PROFILE=1 timeout 150 "$Q" bench --backend cuda --synthetic $m --type bf16 $shape -b 1 \
      >> "$OUT/profiles.md" 2>&1
  done
done
part profiles && for m in qwen3.6-27b qwen3.6-35b-a3b; do
  echo "## $m q4_k_m -p \"\" -n 16 -r 1" >> "$OUT/profiles.md"
  QWEN36_PROFILE=1 timeout 150 "$Q" bench --backend cuda --synthetic $m --type q4_k_m -p "" -n 16 -r 1 -b 1 \
    >> "$OUT/profiles.md" 2>&1
done
# Kernel by kernel (ncu: each alone, cold L2; needs a runtime that lets ncu read the counters)
part profiles && command -v ncu > /dev/null && for m in qwen3.6-27b qwen3.6-35b-a3b; do
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$Q" bench --backend cuda --synthetic $m --type q4_k_m -p "" -n 2 -r 1 -b 1 > "$OUT/ncu-$m.csv" 2> /dev/null &&
    { echo "## $m q4_k_m decode step, per kernel (ncu)"; scripts/ncu-step.py "$OUT/ncu-$m.csv"; } >> "$OUT/profiles.md"
done
# Kernel by kernel in the replayed decode step (tools/kernel_trace: CUPTI times every kernel of
# the graph replays without serializing them; scripts/trace-step.py charges each the time since
# the previous one ended): where a step's time goes, PDL overlap included.
if part trace && [ -f "$TRACE_LIB" ]; then
  : > "$OUT/trace.md"
  for m in qwen3.6-27b qwen3.6-35b-a3b; do
    for t in q4_k_m bf16; do
      CUDA_INJECTION64_PATH=$TRACE_LIB QWEN36_TRACE_OUT=/tmp/qwen36-trace.csv timeout 200 "$Q" bench --backend cuda \
        --synthetic $m --type $t -p "" -n 24 -b 1 -r 1 > /dev/null 2>&1
      { echo "## $m $t decode step, b1 (kernel_trace)"; scripts/trace-step.py /tmp/qwen36-trace.csv --steps 8; echo; } \
        >> "$OUT/trace.md" 2>&1
    done
  done
  # A DDTree round's verify pass (27B Q4_K_M, budget 22, SIMULATED acceptance): the round's largest
  # graph (a decode step's is ~440 kernels, the verify pass's more than 600).
  CUDA_INJECTION64_PATH=$TRACE_LIB QWEN36_TRACE_OUT=/tmp/qwen36-trace.csv timeout 200 "$Q" bench --backend cuda \
    --synthetic qwen3.6-27b --type q4_k_m -p "" -n 48 -b 1 -r 1 --spec dflash --spec-draft-n 15 --tree-budget 22 \
    --simulate-accept-length 9 > /dev/null 2>&1
  { echo "## qwen3.6-27b q4_k_m DDTree verify pass, budget 22 (kernel_trace, SIMULATED acceptance)"
    scripts/trace-step.py /tmp/qwen36-trace.csv --min-kernels 600 --steps 5; echo; } >> "$OUT/trace.md" 2>&1
  # A whole quantized prefill (bench's warm-up + one forward: --per 2), the generation excluded.
  for mp in "qwen3.6-27b 512" "qwen3.6-35b-a3b 4096"; do
    set -- $mp
    CUDA_INJECTION64_PATH=$TRACE_LIB QWEN36_TRACE_OUT=/tmp/qwen36-trace.csv timeout 200 "$Q" bench --backend cuda \
      --synthetic $1 --type q4_k_m -p $2 -n "" -r 1 > /dev/null 2>&1
    { echo "## $1 q4_k_m pp$2, kernel time per forward (kernel_trace)"
      scripts/trace-totals.py /tmp/qwen36-trace.csv --per 2 --exclude 'random_blocks|repack_kernel|fill_kernel'; echo; } \
      >> "$OUT/trace.md" 2>&1
  done
  rm -f /tmp/qwen36-trace.csv
fi
# Expert offload (issue 11): a 35B-A3B Q4_K_M file (gen-model, ~20 GiB in $QWEN36_OFFLOAD_DIR or
# /tmp), all on the GPU, then N layers' routed experts on the host, decode on the host and prefill
# streamed (QWEN36_MOE_STREAM auto; pageable copies, or page-locked with QWEN36_MOE_PIN=1) or
# computed on the host (never). QWEN36_LOG=debug shows the set-up steps' and each host pass's
# times; every run is bounded, so a slow one cannot eat the rest.
if [ "$QUICK" != "--quick" ] && part offload; then
  M35=${QWEN36_OFFLOAD_DIR:-/tmp}/qwen36-35b-a3b-q4_k_m.gguf
  [ -f "$M35" ] || timeout 300 "$Q" gen-model --preset qwen3.6-35b-a3b --type Q4_K_M --out "$M35" > "$OUT/offload.md" 2>&1
  for a in "" "--n-cpu-moe 20" "--n-cpu-moe 40" "--gpu-mem 24GiB --fit" "--gpu-mem 16GiB --fit"; do
    for env in "QWEN36_MOE_STREAM=auto" "QWEN36_MOE_STREAM=auto QWEN36_MOE_PIN=1" "QWEN36_MOE_STREAM=never"; do
      [ -z "$a" ] && [ "$env" != QWEN36_MOE_STREAM=auto ] && continue
      echo "## bench -m 35B-A3B Q4_K_M $a ($env)" >> "$OUT/offload.md"
      env QWEN36_LOG=debug $env timeout 240 "$Q" bench --backend cuda -m "$M35" $a -p 512,4096 -n 32 -r 1 \
        >> "$OUT/offload.md" 2>&1
      echo "rc=$?" >> "$OUT/offload.md"
    done
  done
fi
# Tensor parallelism (issue 12), with two GPUs: the TP tests, decode and serving on 2 GPUs
# against GPU 0 alone, and 35B-A3B expert parallelism. NCCL_NVLS_ENABLE=0: this machine needs
# NVLink multicast off.
if part tp && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  export NCCL_NVLS_ENABLE=0
  timeout 300 "$TP_TESTS" > "$OUT/tp-tests.log" 2>&1; echo "=== test_cuda_tp rc=$?" | tee -a "$OUT/tp-tests.log"
  : > "$OUT/tp.md"
  for tp in "" "-tp 2"; do
    echo "## 27B q4_k_m $tp" >> "$OUT/tp.md"
    timeout 300 "$Q" bench --backend cuda --synthetic qwen3.6-27b --type q4_k_m -p 512 -n 64 -b 1,8,32 -r 2 $tp \
      >> "$OUT/tp.md" 2>&1
  done
  for ep in "" "--expert-parallel"; do
    echo "## 35B-A3B q4_k_m -tp 2 $ep" >> "$OUT/tp.md"
    timeout 300 "$Q" bench --backend cuda --synthetic qwen3.6-35b-a3b --type q4_k_m -p 512 -n 64 -b 1,32 -r 2 \
      -tp 2 $ep >> "$OUT/tp.md" 2>&1
  done
  for tp in "" "-tp 2"; do
    echo "## bench-serve 27B q4_k_m $tp" >> "$OUT/tp.md"
    timeout 400 "$Q" bench-serve --backend cuda --synthetic qwen3.6-27b --type q4_k_m --streams 1,16,32 \
      --prompt-tokens 512 --gen-tokens 128 --rounds 2 $tp >> "$OUT/tp.md" 2>&1
  done
fi
