#!/usr/bin/env bash
# Refreshes the console's screenshots committed under docs/console/ (every
# page, at desktop width and at a phone's 390 px) by running the browser
# suite with its screenshots written there. The README shows some of them.
#   tests/console/screenshots.sh      (then commit docs/console/)
# FASTACK_BIN and CHROMIUM as for tests/console/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(pwd)/docs/console"
rm -rf "$out"
mkdir -p "$out"
SCREENSHOTS="$out" tests/console/run.sh
echo "refreshed $(ls "$out" | wc -l) screenshots in docs/console/"
