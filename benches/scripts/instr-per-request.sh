#!/usr/bin/env bash
# Instructions per `track` request, counted by callgrind: the server runs
# under `valgrind --tool=callgrind`, wrk drives it for a while (after a
# warm-up), and the counts of that window are divided by the requests it
# answered. Instruction counts do not depend on what else the machine is
# doing, so two builds compare on a noisy box where req/s do not; what they
# leave out is the kernel's side of system calls and the I/O itself.
#
# Usage: benches/scripts/instr-per-request.sh [sqlite|postgres|baseline] [seconds]
#   baseline: the bare poem 202 endpoint of `fastack-bench` (the floor)
#   FASTACK_BIN   the build to measure (default $CARGO_TARGET_DIR or
#                 target, then release/fastack)
#   CONNS         wrk connections (default 32)
#   BATCH         events per request (default 1: `track`; more: `batch`)
#   WARM          seconds of load before the window (default 5; the load's
#                 5,000 users are all known after 5,000 events)
#   OUT           callgrind's file name (default: in a temporary dir, kept
#                 for `callgrind_annotate`; one file per thread)
# Prints the total per request, its split by thread kind and each kind's
# functions by self count (benches/scripts/callgrind-split.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
backend=${1:-sqlite}
secs=${2:-20}
bin=${FASTACK_BIN:-${CARGO_TARGET_DIR:-target}/release/fastack}
conns=${CONNS:-32}
batch=${BATCH:-1}
warm=${WARM:-5}
dir=$(mktemp -d)
out=${OUT:-$dir/callgrind.out}
pid=""
db=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  [ -n "$db" ] && psql -h 127.0.0.1 -U postgres -d test -qc "drop database if exists $db with (force)" >/dev/null || true
  rm -rf "$dir/data"
}
trap cleanup EXIT

export FASTACK_DATA_DIR=$dir/data FASTACK_LISTEN=127.0.0.1:0 FASTACK_BOOTSTRAP=false \
  FASTACK_LOG=info FASTACK_ENC_KEY=ZmFzdGFjay1iZW5jaC1tYXN0ZXIta2V5LTMyLWJ5dGVzIQ==
if [ "$backend" = postgres ]; then
  db=fastack_instr_$$
  psql -h 127.0.0.1 -U postgres -d test -qc "create database $db" >/dev/null
  export FASTACK_DATABASE_URL=postgres://postgres@127.0.0.1:5432/$db \
    FASTACK_REDIS_URL=redis://127.0.0.1:6379 FASTACK_REDIS_PREFIX=instr$$
fi
if [ "$backend" = baseline ]; then
  key=none serve=baseline marker='baseline listening'
  bin=${FASTACK_BENCH:-$(dirname "$bin")/fastack-bench}
else
  "$bin" migrate >/dev/null
  "$bin" admin tenant create --name instr --plan enterprise --json >/dev/null
  key=$("$bin" admin key create --tenant instr --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
  serve=serve marker='fastack listening'
fi

# One file per thread: the split by thread is printed at the end.
valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out" "$bin" $serve 2>"$dir/serve.log" &
pid=$!
addr=""
for _ in $(seq 240); do
  addr=$(grep -o "$marker.*addr=[0-9.:]*" "$dir/serve.log" | sed 's/.*addr=//' || true)
  [ -n "$addr" ] && break
  sleep 0.5
done
[ -n "$addr" ] || { cat "$dir/serve.log" >&2; echo "server did not start" >&2; exit 1; }

load() {
  FASTACK_BENCH_KEY=$key FASTACK_BENCH_RUN=$1 FASTACK_BENCH_BATCH=$batch wrk -t1 -c"$conns" -d"$2"s --timeout 10s \
    -s benches/wrk/events.lua "http://$addr"
}
load warm "$warm" >/dev/null
callgrind_control -z "$pid" >/dev/null
report=$(load run "$secs")
callgrind_control -d "$pid" >/dev/null
echo "$report" | grep -v WRK_JSON
n=$(echo "$report" | sed -n 's/^WRK_JSON //p' | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["requests"] - r["non_2xx"])')
echo "requests answered 2xx in the window: $n"
python3 benches/scripts/callgrind-split.py "$n" "$out".*
