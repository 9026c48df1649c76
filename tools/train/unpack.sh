#!/usr/bin/env bash
# Reassembles what tools/train/pack.sh sent back, on this machine.
#   tools/train/unpack.sh DEST PART_DIR [PART_DIR ...]
# Checks every part against SHA256SUMS, unpacks into DEST and copies the tokenizer files from
# .models/qwen3-tokenizer into DEST/hf (scripts/fetch-tokenizer.sh fetches them).
set -euo pipefail
DEST=${1:?usage: tools/train/unpack.sh DEST PART_DIR [PART_DIR ...]}
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for d in "$@"; do cp "$d"/run.tar.gz.part-* "$work/" 2>/dev/null || true; cp "$d/SHA256SUMS" "$work/"; done
(cd "$work" && sha256sum -c SHA256SUMS)
mkdir -p "$DEST"
cat "$work"/run.tar.gz.part-* | tar -xzf - -C "$DEST"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
for f in tokenizer.json tokenizer_config.json; do cp "$root/.models/qwen3-tokenizer/$f" "$DEST/hf/$f"; done
echo "unpack: $DEST/hf is a complete HF checkpoint"
