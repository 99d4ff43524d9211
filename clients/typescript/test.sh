#!/usr/bin/env bash
# The TypeScript SDK's test suite, against the real server binary:
#   clients/typescript/test.sh
# FASTACK_BIN names the binary (default: <repo>/target/debug/fastack).
# Installs exactly the locked dependencies (npm ci), builds dist/ with tsc,
# then runs node's test runner (two files at a time). Exits non-zero on any
# failure. Regenerating src/generated/ (npm run generate) is not part of it.
set -euo pipefail
cd "$(dirname "$0")"
root="$(cd ../.. && pwd)"
export FASTACK_BIN="${FASTACK_BIN:-$root/target/debug/fastack}"

if [ ! -x "$FASTACK_BIN" ]; then
  echo "FAIL: no fastack binary at $FASTACK_BIN (build it with 'cargo build --bin fastack' or set FASTACK_BIN)" >&2
  exit 1
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
  echo "FAIL: the test suite needs Node.js >= 20 (found $(node --version)); the package itself runs on >= 18" >&2
  exit 1
fi

echo "== npm ci"
npm ci --no-audit --no-fund
echo "== build"
npm run --silent build
echo "== typecheck (README examples against dist/*.d.ts)"
npm run --silent typecheck
echo "== test (FASTACK_BIN=$FASTACK_BIN)"
node --test --test-concurrency=2 test/*.test.js
