#!/usr/bin/env bash
# Two builds of fastack against each other on one box, alternating
# base, new, new, base (so neither build always runs after the other):
# `fastack-bench` closed loop, 8 s after a 2 s warm-up, each build serving
# its own load (one load tool for both: FASTACK_BENCH, by default the
# fastack-bench beside NEW_BIN, else the one in target/release; BASE_BENCH,
# when set, for the base side: the load tool opens the store to create its
# tenants, so a base with an older schema needs the load tool of its own
# build). Prints
# one line a run: backend, profile, pair, build, req/s, events/s, p99 ms,
# errors, the server's CPU µs per event (from /proc: less moved than req/s
# by a neighbour taking the machine's time), and the server's group
# commits and processing rounds per 1,000 events (from its /metrics; "-"
# for a build without them).
#
# Usage: benches/scripts/ab-pairs.sh BASE_BIN NEW_BIN BACKEND PROFILE [PAIRS]
#   BACKEND sqlite|postgres; PROFILE track (32 connections) | batch (8)
# A setting against its absence, with one build: the same binary twice and
# NEW_SERVER_ENV="KEY=VALUE ..." for the new side (`{dir}` in a value is
# the run's own directory, emptied after each run). SERVER_ENV, in the same
# form, is set for both sides (two builds with the mirror on).
set -uo pipefail
base=$1 new=$2 backend=$3 profile=$4 pairs=${5:-2}
conns=32
bench=${FASTACK_BENCH:-$(dirname "$new")/fastack-bench}
[ -x "$bench" ] || bench=${CARGO_TARGET_DIR:-target}/release/fastack-bench
[ "$profile" = batch ] && conns=8
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for pair in $(seq "$pairs"); do
  for which in base new new base; do
    bin=$base
    tool=${BASE_BENCH:-$bench}
    extra=()
    for kv in ${SERVER_ENV:-}; do extra+=(--server-env "${kv//\{dir\}/$dir/run}"); done
    if [ "$which" = new ]; then
      bin=$new
      tool=$bench
      for kv in ${NEW_SERVER_ENV:-}; do extra+=(--server-env "${kv//\{dir\}/$dir/run}"); done
    fi
    mkdir -p "$dir/run"
    (cd "$dir" && "$tool" --server "$bin" --backend "$backend" --profile "$profile" --connections "$conns" \
      --duration 8 --warmup 2 --no-baseline --out "$dir/run.json" "${extra[@]}" >/dev/null 2>&1)
    rm -rf "$dir/run"
    figures=$(python3 - "$dir/run.json" <<'PY' 2>/dev/null || echo "failed"
import json, sys
f = json.load(open(sys.argv[1]))["fastack"]
cpu = f.get("server_cpu_us_per_event")
w = f.get("server_work")
work = "%.2f\t%.2f" % (w["group_commits_per_1k_events"], w["rounds_per_1k_events"]) if w else "-\t-"
print("%.0f\t%.0f\t%.2f\t%d\t%s\t%s" % (f["requests_per_sec"], f["events_per_sec"], f["p99_ms"], sum(f["errors"].values()), "%.1f" % cpu if cpu else "-", work))
PY
)
    printf '%s\t%s\t%s\t%s\t%s\n' "$backend" "$profile" "$pair" "$which" "$figures"
    rm -f "$dir/run.json"
  done
done
