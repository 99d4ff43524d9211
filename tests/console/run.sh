#!/usr/bin/env bash
# The console's browser suite: Debian's Chromium driven by playwright-core
# against the real binary.
#   tests/console/run.sh
# FASTACK_BIN names the binary (default: <repo>/target/debug/fastack),
# CHROMIUM the browser (default: /usr/bin/chromium; `apt-get install
# chromium`). Screenshots of each page land in <repo>/target/console-screenshots.
set -euo pipefail
cd "$(dirname "$0")"
root="$(cd ../.. && pwd)"
export FASTACK_BIN="${FASTACK_BIN:-$root/target/debug/fastack}"
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$FASTACK_BIN" ]; then
  echo "FAIL: no fastack binary at $FASTACK_BIN (cargo build --bin fastack, or set FASTACK_BIN)" >&2
  exit 1
fi
if [ ! -x "$CHROMIUM" ]; then
  echo "FAIL: no Chromium at $CHROMIUM (apt-get install chromium, or set CHROMIUM)" >&2
  exit 1
fi
npm ci --no-audit --no-fund --silent
node --test --test-concurrency=1 console.test.mjs
echo "screenshots: ${SCREENSHOTS:-$root/target/console-screenshots}"
