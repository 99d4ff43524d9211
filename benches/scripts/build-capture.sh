#!/usr/bin/env bash
# Builds PostHog's capture (the Rust capture server PostHog ran before it
# moved into its monorepo), the peer `fastack-bench --capture` measures
# beside fastack and the bare baseline. Nothing of it is kept in this
# repository: the script checks out a pinned commit, builds it in a
# directory of its own and prints the binary's path.
#
# Usage: benches/scripts/build-capture.sh [SOURCE] [WORKDIR]
#   SOURCE   a clone of PostHog/capture, or a git URL
#            (default https://github.com/PostHog/capture)
#   WORKDIR  where to check out and build (default ~/.cache/fastack/capture)
#
# Needs cmake and a C compiler (librdkafka is built from source even
# though the print sink never uses Kafka). Run the binary as the load tool
# does: PRINT_SINK=true ADDRESS=127.0.0.1:PORT REDIS_URL=redis://127.0.0.1:6379
# KAFKA_HOSTS=127.0.0.1:9092 KAFKA_TOPIC=events; it answers POST /i/v0/e.
set -euo pipefail
source=${1:-https://github.com/PostHog/capture}
work=${2:-$HOME/.cache/fastack/capture}
# The last commit of PostHog/capture before it moved (2024-01); its
# Cargo.lock's `time` no longer builds on current rustc, hence the update.
commit=9cd11327

command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake)" >&2; exit 1; }
if [ ! -d "$work/src/.git" ]; then
  mkdir -p "$work"
  git clone -q "$source" "$work/src"
fi
cd "$work/src"
git checkout -q -f "$commit"
git checkout -q -- Cargo.lock
cargo update -q -p time --precise 0.3.36
CARGO_TARGET_DIR="$work/target" cargo build -q --release -p capture-server >&2
echo "$work/target/release/capture-server"
