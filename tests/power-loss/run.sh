#!/usr/bin/env bash
# Power loss under load, on the embedded store (docs/reliability.md,
# "Power loss: LazyFS").
#
# `kill -9` keeps the kernel's page cache, so it cannot catch a write the
# node answered for and never synced. Here the data directory sits on
# LazyFS (https://github.com/dsrhaslab/lazyfs), a FUSE file system that
# keeps every write in its own cache until it is fsynced and drops what is
# not synced when told to (`lazyfs::clear-cache` written to its fault
# FIFO). Each run:
#
#   1. mounts LazyFS over a fresh directory and creates a tenant and a key
#      (`fastack admin`) in the data directory on it;
#   2. starts the release binary there (embedded) and drives it with
#      batches and single tracks, each event with its own idempotency key
#      (client.py load), recording every request answered 202;
#   3. after a random 1-6 s of load cuts the power: `kill -9` of the node,
#      then LazyFS's report of the bytes not fsynced and `clear-cache`,
#      which drops them — the process and the unsynced page cache die
#      together, and nothing runs between the two that could sync (or,
#      CUT=fsync, at the next fsync of an accept log segment: see below);
#   4. unmounts LazyFS and mounts it again (a fresh LazyFS process: only
#      what reached the disk below), starts the node on what survived and
#      times its way to /readyz;
#   5. sends every request left without an answer again, same body, same
#      keys (client.py resend), reads every event back (client.py check):
#      every answered key stored exactly once with the id it was answered
#      with, no key stored twice, nothing stored that nobody sent.
#
# Usage (as root, or with /dev/fuse usable by the user):
#
#   apt-get install -y cmake g++ libfuse3-dev fuse3
#   git clone https://github.com/dsrhaslab/lazyfs /opt/lazyfs   # tested at a47a5ba
#   cargo build --release
#   LAZYFS_SRC=/opt/lazyfs tests/power-loss/run.sh
#
# Settings (environment):
#   RUNS=20               runs, one power cut each, each on a fresh directory
#   FASTACK_BIN=target/release/fastack
#   LAZYFS_BIN=…          a built lazyfs binary; else LAZYFS_SRC=<checkout>,
#                         built there when its build/lazyfs is missing
#   TOML11_SRC, SPDLOG_SRC  offline build: checkouts of toml11 v3.7.1 and
#                         spdlog v1.10.0, used instead of LazyFS's downloads
#   WORK=/tmp/fastack-power-loss   run directories (a failed run's is kept)
#   PORT=18480  CLIENTS=2  SEED=1  LOAD_MIN_MS=1000  LOAD_MAX_MS=6000
#   MAX_BATCH=20  PAUSE_MS=20   each client's batches and pause between requests
#   KEEP=1                keep every run's directory
#   CUT=random            the cut after the random load time; CUT=fsync: at
#                         the first fsync of an accept log segment after it
#                         (LazyFS's crash fault: it reports what is unsynced
#                         and kills itself before the fsync, the node next)
#
# Prints one line per run and a summary; exits 1 when any run failed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
RUNS=${RUNS:-20}
FASTACK_BIN=${FASTACK_BIN:-$repo/target/release/fastack}
LAZYFS_BIN=${LAZYFS_BIN:-}
LAZYFS_SRC=${LAZYFS_SRC:-}
WORK=${WORK:-/tmp/fastack-power-loss}
PORT=${PORT:-18480}
CLIENTS=${CLIENTS:-2}
MAX_BATCH=${MAX_BATCH:-20}
PAUSE_MS=${PAUSE_MS:-20}
SEED=${SEED:-1}
LOAD_MIN_MS=${LOAD_MIN_MS:-1000}
LOAD_MAX_MS=${LOAD_MAX_MS:-6000}
KEEP=${KEEP:-0}
CUT=${CUT:-random}
ENC_KEY=${FASTACK_ENC_KEY:-ZmFzdGFjay1iZW5jaC1tYXN0ZXIta2V5LTMyLWJ5dGVzIQ==}
URL="http://127.0.0.1:$PORT"

die() { echo "power-loss: $*" >&2; exit 2; }

build_lazyfs() {
  local src=$1
  [ -d "$src/libs/libpcache" ] && [ -d "$src/lazyfs" ] || die "$src is not a LazyFS checkout"
  echo "building LazyFS in $src (log: $src/build.log)" >&2
  (
    set -e
    cd "$src/libs/libpcache"
    mkdir -p build/_deps
    local flags=()
    if [ -n "${TOML11_SRC:-}" ]; then flags+=("-DFETCHCONTENT_SOURCE_DIR_TOML=$TOML11_SRC"); fi
    if [ -n "${SPDLOG_SRC:-}" ]; then
      # lazyfs's own CMakeLists reads spdlog's headers from this path.
      [ -d build/_deps/spdlog-src ] || cp -r "$SPDLOG_SRC" build/_deps/spdlog-src
      flags+=("-DFETCHCONTENT_SOURCE_DIR_SPDLOG=$PWD/build/_deps/spdlog-src")
    fi
    (cd build && cmake "${flags[@]}" .. && cmake --build .)
    cd "$src/lazyfs"
    mkdir -p build
    (cd build && cmake -DLAZYFS_BUILD_TESTS=OFF .. && cmake --build .)
  ) >"$src/build.log" 2>&1 || die "LazyFS did not build: see $src/build.log"
}

if [ -z "$LAZYFS_BIN" ]; then
  [ -n "$LAZYFS_SRC" ] || die "set LAZYFS_BIN to a built lazyfs, or LAZYFS_SRC to a checkout of
  https://github.com/dsrhaslab/lazyfs (apt-get install -y cmake g++ libfuse3-dev fuse3)"
  [ -x "$LAZYFS_SRC/lazyfs/build/lazyfs" ] || build_lazyfs "$LAZYFS_SRC"
  LAZYFS_BIN=$LAZYFS_SRC/lazyfs/build/lazyfs
fi
[ -x "$LAZYFS_BIN" ] || die "no lazyfs binary at $LAZYFS_BIN"
[ -x "$FASTACK_BIN" ] || die "no fastack binary at $FASTACK_BIN (cargo build --release)"
[ -e /dev/fuse ] || die "/dev/fuse is missing"
command -v fusermount3 >/dev/null || die "fusermount3 is missing (apt-get install fuse3)"
command -v curl >/dev/null || die "curl is missing"
mkdir -p "$WORK"

# What is running now, for the trap.
node_pid="" load_pid="" lazyfs_pid="" mnt=""

stop_node() {
  if [ -n "$node_pid" ]; then
    kill -TERM "$node_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$node_pid" 2>/dev/null || true
    wait "$node_pid" 2>/dev/null || true
    node_pid=""
  fi
}

unmount() {
  # A LazyFS that crashed leaves its mount behind, not connected.
  if [ -n "$mnt" ] && grep -q " $mnt " /proc/mounts; then
    fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" 2>/dev/null || true
  fi
  if [ -n "$lazyfs_pid" ]; then
    for _ in $(seq 100); do kill -0 "$lazyfs_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$lazyfs_pid" 2>/dev/null || true
    wait "$lazyfs_pid" 2>/dev/null || true
    lazyfs_pid=""
  fi
}

cleanup() {
  if [ -n "$load_pid" ]; then kill -KILL "$load_pid" 2>/dev/null || true; fi
  stop_node
  unmount
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }

# mount_lazyfs DIR: LazyFS over DIR/root at DIR/mnt, its log in DIR/lazyfs.log.
mount_lazyfs() {
  local d=$1
  mnt=$d/mnt
  : >"$d/lazyfs.log"
  # -f: in the foreground, so $! is LazyFS itself (FUSE forks away without).
  "$LAZYFS_BIN" "$mnt" --config-path "$d/lazyfs.toml" \
    -o modules=subdir -o subdir="$d/root" -f >>"$d/lazyfs.out" 2>&1 &
  lazyfs_pid=$!
  for _ in $(seq 300); do
    mountpoint -q "$mnt" && grep -q "waiting for fault commands" "$d/lazyfs.log" && return 0
    kill -0 "$lazyfs_pid" 2>/dev/null || break
    sleep 0.1
  done
  die "LazyFS did not mount at $mnt (see $d/lazyfs.out)"
}

# fault DIR COMMAND WAIT_FOR: writes COMMAND to the FIFO, waits for a log line.
fault() {
  local d=$1 cmd=$2 want=$3
  timeout 10 bash -c "echo '$cmd' > '$d/faults.fifo'" || die "LazyFS took no command"
  for _ in $(seq 600); do
    grep -q "$want" "$d/lazyfs.log" && return 0
    sleep 0.05
  done
  die "LazyFS did not finish $cmd"
}

# The node's settings and nothing else from the environment.
node_env() {
  node_env=(env -i PATH="$PATH" HOME="$HOME" FASTACK_DATA_DIR="$mnt/data"
    FASTACK_LISTEN="127.0.0.1:$PORT" FASTACK_BOOTSTRAP=false
    FASTACK_ENC_KEY="$ENC_KEY" FASTACK_LOG=info)
}
fastack() { node_env; "${node_env[@]}" "$FASTACK_BIN" "$@"; }

# start_node LOG: starts the node; ready_s: the seconds until /readyz is 200.
ready_s=""
start_node() {
  local log=$1 t0
  ready_s=""
  if curl -s -o /dev/null "$URL/healthz"; then die "something already listens on $URL (set PORT)"; fi
  t0=$(now)
  node_env
  # env execs the binary: $! is the node's own pid, the one kill -9 hits.
  "${node_env[@]}" "$FASTACK_BIN" serve >>"$log" 2>&1 &
  node_pid=$!
  for _ in $(seq 1200); do
    if curl -sf -o /dev/null "$URL/readyz"; then
      ready_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
      return 0
    fi
    kill -0 "$node_pid" 2>/dev/null || { node_pid=""; return 1; }
    sleep 0.05
  done
  return 1
}

py() { python3 "$here/client.py" "$@"; }
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

passed=0 failed=0
tot_answered=0 tot_stored=0 tot_doubled=0 tot_lost=0 tot_unsynced=0 tot_resent=0
results=$WORK/results.tsv
printf 'run\tload_ms\tanswered\treadable_once\tstored\tlost\tdoubled\tunknown\tresent_requests\talready_accepted\tunsynced_bytes\trecovery_s\treadable_after_s\terror_lines\tresult\tunsynced_files\n' >"$results"

echo "power loss ($CUT cut): $RUNS runs, fastack $FASTACK_BIN, LazyFS $LAZYFS_BIN, work $WORK"
RANDOM=$SEED
for run in $(seq 1 "$RUNS"); do
  d=$WORK/run-$(printf %02d "$run")
  if [ -n "$(ls -A "$d" 2>/dev/null)" ]; then
    if mountpoint -q "$d/mnt"; then fusermount3 -u "$d/mnt"; fi
    rm -rf "$d"
  fi
  mkdir -p "$d/root" "$d/mnt" "$d/state"
  mkfifo "$d/faults.fifo"
  cat >"$d/lazyfs.toml" <<EOF
[faults]
fifo_path="$d/faults.fifo"

[cache]
apply_eviction=false

[cache.simple]
custom_size="1gb"
blocks_per_page=1

[filesystem]
log_all_operations=false
logfile="$d/lazyfs.log"
EOF
  load_ms=$((LOAD_MIN_MS + (RANDOM * 32768 + RANDOM) % (LOAD_MAX_MS - LOAD_MIN_MS + 1)))
  mount_lazyfs "$d"

  fastack migrate >>"$d/admin.log" 2>&1 || die "run $run: fastack migrate failed (see $d/admin.log)"
  fastack admin --json tenant create --name power --plan enterprise >>"$d/admin.log" 2>&1 \
    || die "run $run: no tenant (see $d/admin.log)"
  key=$(fastack admin --json key create --tenant power 2>>"$d/admin.log") \
    || die "run $run: no key (see $d/admin.log)"
  secret=$(field "$key" secret)

  start_node "$d/node-1.log" || die "run $run: the node did not start (see $d/node-1.log)"
  py load --url "$URL" --key "$secret" --state "$d/state" --prefix "r$run" \
    --clients "$CLIENTS" --max-batch "$MAX_BATCH" --pause-ms "$PAUSE_MS" >"$d/load.json" 2>"$d/load.err" &
  load_pid=$!
  sleep "$(awk -v ms="$load_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"

  if [ "$CUT" = fsync ]; then
    # The power cut at the next sync of an accept log segment: LazyFS
    # reports what is unsynced and kills itself before that fsync runs (its
    # cache goes with it), then the node is killed.
    fault "$d" "lazyfs::crash::timing=before::op=fsync::from_rgx=.*[.]seg" "VALID crash fault"
    for _ in $(seq 600); do kill -0 "$lazyfs_pid" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$lazyfs_pid" 2>/dev/null && die "run $run: no segment was synced within 30 s"
    wait "$lazyfs_pid" 2>/dev/null || true
    lazyfs_pid=""
    kill -KILL "$node_pid"
    wait "$node_pid" 2>/dev/null || true
    node_pid=""
  else
    # The power cut: the process and every write not yet synced, together.
    kill -KILL "$node_pid"
    wait "$node_pid" 2>/dev/null || true
    node_pid=""
    fault "$d" "lazyfs::unsynced-data-report" "total number of bytes un-fsynced\|all data blocks are synced"
    fault "$d" "lazyfs::clear-cache" "cache is cleared"
  fi
  load_rc=0
  wait "$load_pid" || load_rc=$?
  load_pid=""
  report=$(py lazyfs-report "$d/lazyfs.log")
  echo "$report" >"$d/unsynced.json"
  unsynced=$(field "$report" unsynced_bytes)
  unsynced_files=$(python3 -c 'import json,sys; print(",".join(json.loads(sys.argv[1])["files"]) or "-")' "$report")
  case $unsynced in ''|*[!0-9]*) unsynced=0 ;; esac
  unmount
  mv "$d/lazyfs.log" "$d/lazyfs-cut.log"
  mount_lazyfs "$d"

  result=FAIL
  recovery=""
  if start_node "$d/node-2.log"; then recovery=$ready_s; fi
  if [ -n "$recovery" ] && [ "$load_rc" = 0 ] \
    && py resend --url "$URL" --key "$secret" --state "$d/state" >"$d/resend.json" 2>"$d/resend.err" \
    && py check --url "$URL" --key "$secret" --state "$d/state" >"$d/check.json" 2>"$d/check.err"; then
    result=PASS
  fi
  stop_node
  unmount

  load_out=$(cat "$d/load.json" 2>/dev/null || echo '{}')
  check_out=$(cat "$d/check.json" 2>/dev/null || echo '{}')
  resend_out=$(cat "$d/resend.json" 2>/dev/null || echo '{}')
  errors=$(grep -c ' ERROR ' "$d/node-2.log" || true)
  get() { python3 -c 'import json,sys; print(json.loads(sys.argv[1] or "{}").get(sys.argv[2], "-"))' "$1" "$2"; }
  answered=$(get "$check_out" answered_events)
  once=$(get "$check_out" readable_once)
  stored=$(get "$check_out" stored_events)
  lost=$(get "$check_out" lost)
  doubled=$(get "$check_out" doubled)
  unknown=$(get "$check_out" unknown)
  after=$(get "$check_out" readable_after_s)
  resent=$(get "$resend_out" resent_requests)
  dup=$(get "$resend_out" already_accepted_events)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$load_ms" "$answered" "$once" \
    "$stored" "$lost" "$doubled" "$unknown" "$resent" "$dup" "$unsynced" "${recovery:--}" "$after" "$errors" "$result" "$unsynced_files" >>"$results"
  printf 'run %2d: %s  cut after %5d ms; %s events answered, %s readable once, %s stored, lost %s, doubled %s, unknown %s; %s requests sent again (%s events already accepted); %s unsynced bytes dropped; restart to ready %s s, all readable %s s later; %s ERROR lines\n' \
    "$run" "$result" "$load_ms" "$answered" "$once" "$stored" "$lost" "$doubled" "$unknown" "$resent" "$dup" "$unsynced" "${recovery:--}" "$after" "$errors"
  if [ "$result" = PASS ]; then
    passed=$((passed + 1))
    tot_answered=$((tot_answered + answered))
    tot_stored=$((tot_stored + stored))
    tot_resent=$((tot_resent + resent))
    [ "$KEEP" = 1 ] || rm -rf "$d"
  else
    failed=$((failed + 1))
    echo "  run $run kept in $d: load $load_out; $(cat "$d/load.err" "$d/resend.err" "$d/check.err" 2>/dev/null | head -20)" >&2
  fi
  tot_unsynced=$((tot_unsynced + unsynced))
done

echo "results: $results"
if [ "$failed" = 0 ]; then
  echo "PASS: $passed of $RUNS power cuts; $tot_answered events answered, $tot_stored stored, each once; $tot_resent requests sent again; $tot_unsynced unsynced bytes dropped in all"
  exit 0
fi
echo "FAIL: $failed of $RUNS runs failed (kept under $WORK)"
exit 1
