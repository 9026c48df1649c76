#!/usr/bin/env bash
# The server's request paths on a GPU against the CPU backend: `qwen36 serve --backend cuda` and
# `qwen36 serve` (reference) on the same model, scripts/server-smoke.py between them; a
# `serve --backend cuda --spec mtp` against the plain CUDA server (scripts/spec-serve-check.py);
# then a two-turn `qwen36 chat --backend cuda`. Logs go to OUT.
#   scripts/gpu-server-smoke.sh QWEN36_BINARY MODEL.gguf OUT_DIR
# With binaries built elsewhere (scripts/pack-prebuilt.sh), the model may be any GGUF that
# carries its tokenizer and chat template (the built-in one, or it requantized to fit a transfer).
set -u
Q=${1:?qwen36 binary} M=${2:?model} OUT=${3:?output folder}
mkdir -p "$OUT"
"$Q" serve --backend cuda -m "$M" --port 8080 > "$OUT/serve-cuda.log" 2>&1 &
C=$!
"$Q" serve -m "$M" --port 8081 > "$OUT/serve-cpu.log" 2>&1 &
H=$!
"$Q" serve --backend cuda -m "$M" --port 8082 --spec mtp > "$OUT/serve-cuda-mtp.log" 2>&1 &
S=$!
python3 - <<'PY'
import time, urllib.request
for port in (8080, 8081, 8082):
    for _ in range(240):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                break
        except Exception:
            pass
        time.sleep(0.5)
    else:
        print("server", port, "not ready")
PY
python3 "$(dirname "$0")/server-smoke.py" http://127.0.0.1:8080 http://127.0.0.1:8081 2>&1 | tee "$OUT/smoke.txt"
rc=${PIPESTATUS[0]}
# Speculative serving on CUDA (MTP): greedy completions equal the plain CUDA server's, and their
# verify rows were sampled on the device (no row's logits to the host).
python3 "$(dirname "$0")/spec-serve-check.py" http://127.0.0.1:8082 http://127.0.0.1:8080 2>&1 | tee "$OUT/spec.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
printf 'def add(a, b):\nWrite a loop\n/exit\n' | timeout 120 "$Q" chat --backend cuda -m "$M" --temp 0 -n 24 \
  > "$OUT/chat.txt" 2>&1 || rc=1
tail -4 "$OUT/chat.txt"
kill $C $H $S
wait
exit $rc
