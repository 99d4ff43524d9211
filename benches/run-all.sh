#!/usr/bin/env bash
# Runs the load profiles of benches/README.md against both backends and
# writes one JSON report per run to benches/results/. Needs a release build
# (`cargo build --release`), and PostgreSQL + Redis for the postgres runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/fastack
bench=${FASTACK_BENCH:-$(dirname "$bin")/fastack-bench}   # the load tool, beside the server by default
out=benches/results
mkdir -p "$out"
d=${DURATION:-15}
run() { name=$1; shift; echo "== $name"; "$bench" --server "$bin" --duration "${DURATION:-$d}" --warmup 3 --out "$out/$name.json" "$@" | grep -E '^\||readable|RSS|inbox' ; }
for backend in sqlite postgres; do
  run "$backend-track-open5000" --backend "$backend" --profile track --rate 5000 --visibility
  run "$backend-track-closed" --backend "$backend" --profile track --connections 32
  run "$backend-batch-closed" --backend "$backend" --profile batch --connections 8
  run "$backend-mixed-closed" --backend "$backend" --profile mixed --connections 32
  run "$backend-duplicates-closed" --backend "$backend" --profile duplicates --connections 32
done
# The same closed loops driven by wrk (a lighter client than the built-in
# one, so the ratio to the bare baseline is the stricter figure): track at
# 32 connections and batches of 100 at 8, each target 8 s after 3 s of
# warm-up; both figures go in one table (benches/table.py).
if command -v wrk >/dev/null; then
  for backend in sqlite postgres; do
    DURATION=8 run "$backend-track-wrk" --backend "$backend" --profile track --connections 32 --wrk benches/wrk/events.lua
    DURATION=8 run "$backend-batch-wrk" --backend "$backend" --profile batch --connections 8 --wrk benches/wrk/events.lua
  done
else
  echo "== wrk runs skipped: install the Debian package wrk"
fi
# Streaming on: send -> core.event.tracked consumed from a bound queue.
run postgres-track-open5000-stream --backend postgres --profile track --rate 5000 --visibility \
  --amqp "${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
# The latency target's run: the same open loop without the visibility
# probe, whose GET polling (a few hundred reads a second) is not part of
# the track profile.
run postgres-track-open5000-plain --backend postgres --profile track --rate 5000
# The same at 2,000 req/s (for boxes where 5,000 is at capacity), and the
# closed loop at 128 connections (larger groups per commit).
run postgres-track-open2000 --backend postgres --profile track --rate 2000 --visibility
run postgres-track-open2000-stream --backend postgres --profile track --rate 2000 --visibility \
  --amqp "${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
run postgres-track-closed128 --backend postgres --profile track --connections 128
# Memory: one and two million accepted events over 1,000 tenants (bounded
# means the second does not grow past the first).
for m in 1 2; do
  echo "== postgres-memory-${m}m-1000tenants"
  "$bench" --server "$bin" --backend postgres --profile batch --tenants 1000 --events "${m}000000" --connections 8 \
    --no-baseline --duration 900 --warmup 0 --out "$out/postgres-memory-${m}m-1000tenants.json" | grep -E '^\||RSS'
done
