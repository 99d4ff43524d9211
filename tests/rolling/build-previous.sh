#!/usr/bin/env bash
# Builds the previous release of fastack — the commit named in
# tests/rolling/PREVIOUS — and prints its binary's path, for the rolling
# upgrade test (tests/e2e/faults.rs, `FASTACK_PREVIOUS_BIN`). A binary
# already built for that commit is reused.
#
#   FASTACK_PREVIOUS_BIN=$(tests/rolling/build-previous.sh) \
#     cargo test --test e2e -- --ignored faults::rolling_upgrade
set -euo pipefail
cd "$(dirname "$0")/../.."
commit=$(tr -d '[:space:]' < tests/rolling/PREVIOUS)
out="${FASTACK_PREVIOUS_DIR:-$HOME/.cache/fastack/previous}"
bin="$out/fastack-$commit"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "previous release $commit is not in this clone's history" >&2
  exit 1
fi
mkdir -p "$out"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git archive "$commit" | tar -x -C "$src"
# A target directory of its own: cargo keys a workspace crate's artifacts
# by its name and version, not its checkout, and judges them fresh by
# mtime; sharing the current build's directory would mix the two builds.
target="$out/target"
(cd "$src" && CARGO_TARGET_DIR="$target" cargo build --quiet --bin fastack >&2)
cp "$target/debug/fastack" "$bin"
echo "$bin"
