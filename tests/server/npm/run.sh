#!/usr/bin/env bash
# ctest's entry to the node tests: run.sh QWEN36_BIN TEST_FILE [chromium]
# Exits 77 (ctest SKIP_RETURN_CODE) with the reason when something they need is absent:
# node >= 18, the npm packages (scripts/setup.sh: npm ci --prefix tests/server/npm), the
# Qwen3 tokenizer (scripts/fetch-tokenizer.sh), and for the browser test /usr/bin/chromium.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$1" file="$2" need="${3:-}"
skip() { echo "SKIP: $*"; exit 77; }
[ -x "$bin" ] || skip "no qwen36 binary at $bin"
command -v node >/dev/null 2>&1 || skip "node is not installed (Debian nodejs)"
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 18 ] || skip "node $major is too old (needs >= 18 for node --test and fetch)"
[ -f "$here/node_modules/openai/package.json" ] || skip "npm packages missing: npm ci --prefix tests/server/npm (scripts/setup.sh)"
[ -f "$here/node_modules/@anthropic-ai/sdk/package.json" ] || skip "npm packages missing (@anthropic-ai/sdk): npm ci --prefix tests/server/npm (scripts/setup.sh)"
tok="${QWEN36_TOKENIZER:-$here/../../../.models/qwen3-tokenizer}"
[ -f "$tok/tokenizer.json" ] || skip "no Qwen3 tokenizer at $tok (scripts/fetch-tokenizer.sh)"
if [ "$need" = chromium ]; then
  [ -f "$here/node_modules/playwright-core/package.json" ] || skip "playwright-core missing (scripts/setup.sh)"
  chrome="${QWEN36_CHROMIUM:-/usr/bin/chromium}"
  [ -x "$chrome" ] || skip "no Chromium at $chrome (Debian chromium; scripts/setup.sh)"
  [ "$major" -ge 20 ] || skip "node $major is too old for playwright-core 1.65 (needs >= 20)"
fi
export QWEN36_BIN="$bin"
# node --test runs the file in a child process; the file's after() hooks and exit handlers
# kill every server it started. The outer timeout is the last resort.
exec timeout -k 10 280 node --test --test-reporter=spec "$here/$file"
