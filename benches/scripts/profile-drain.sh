#!/usr/bin/env bash
# A CPU profile of the server while it drains a backlog: a 20 s closed loop
# of wrk batches (8 connections, no baseline run), then `perf record -g`
# on the server for the 15 s after the load ends. Needs a release build,
# wrk and perf (Debian's linux-perf).
#
#   bash benches/scripts/profile-drain.sh OUT [bench options…]
#   bash benches/scripts/profile-drain.sh /tmp/drain --backend sqlite
#   perf report -i /tmp/drain.perf.data --no-children --sort comm,dso -g none
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
shift
bin=target/release/fastack
bench=${FASTACK_BENCH:-$(dirname "$bin")/fastack-bench}   # the load tool, beside the server by default
"$bench" --server "$bin" --no-baseline --duration 20 --warmup 3 --profile batch --connections 8 \
  --wrk benches/wrk/events.lua "$@" >"$out.bench.txt" 2>&1 &
bench=$!
pid=""
for _ in $(seq 100); do
  pid=$(pgrep -f "$bin serve" | head -1 || true)
  [ -n "$pid" ] && break
  sleep 0.2
done
[ -n "$pid" ] || { echo "the server did not start" >&2; exit 1; }
# 3 s of warm-up and 20 s of load, then the drain.
sleep 24
perf record -F 999 -g -p "$pid" -o "$out.perf.data" -- sleep 15 >/dev/null 2>&1
wait "$bench"
grep -E 'fastack|inbox' "$out.bench.txt"
