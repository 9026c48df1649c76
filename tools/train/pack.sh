#!/usr/bin/env bash
# Packs a run for the trip back from the GPU machine, whose returned files are limited (at most
# 8 files of 16 MiB, 64 MiB per command): one tar.gz of the deliverables split into 15 MiB parts.
#   tools/train/pack.sh RUNDIR DEST [FIRST_PART] [COUNT]
# copies parts FIRST_PART .. FIRST_PART+COUNT-1 (default 0 and 4) plus SHA256SUMS into DEST.
# Run it again with FIRST_PART=4 in a second command (RUNDIR must survive: keep it under build/,
# which stays on the warm machine) until `pack.sh` prints "last part". tools/train/unpack.sh
# reassembles. The tokenizer files are left out (they are in .models/qwen3-tokenizer here).
set -euo pipefail
RUN=${1:?usage: tools/train/pack.sh RUNDIR DEST [FIRST_PART] [COUNT]}
DEST=${2:?usage}
FIRST=${3:-0}
COUNT=${4:-4}
STAGE="$RUN/pack"
if [ ! -s "$STAGE/SHA256SUMS" ]; then
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  files=(MODEL_CARD.md hf/config.json hf/generation_config.json hf/model.safetensors hf/README.md
         train/metrics.json train/train_log.csv train/eval_log.csv corpus/manifest.json corpus/val_files.txt
         check/case.json check/tokens.i32 check/logits.f32 check/mtp_logits.f32 run.log)
  present=()
  for f in "${files[@]}"; do [ -e "$RUN/$f" ] && present+=("$f"); done
  tar -C "$RUN" -cf - "${present[@]}" | gzip -1 > "$STAGE/run.tar.gz"
  (cd "$STAGE" && split -b 15m -d -a 2 run.tar.gz run.tar.gz.part- && rm run.tar.gz && sha256sum run.tar.gz.part-* > SHA256SUMS)
fi
mkdir -p "$DEST"
cp "$STAGE/SHA256SUMS" "$DEST/"
n=$(ls "$STAGE"/run.tar.gz.part-* | wc -l)
for ((i = FIRST; i < FIRST + COUNT && i < n; i++)); do cp "$STAGE/run.tar.gz.part-$(printf %02d "$i")" "$DEST/"; done
if (( FIRST + COUNT >= n )); then echo "pack: last part ($n parts)"; else echo "pack: parts $FIRST..$((FIRST + COUNT - 1)) of $n; next FIRST_PART=$((FIRST + COUNT))"; fi
