#!/usr/bin/env bash
# fastack beside the bare baseline and PostHog's capture, in one run of the
# load tool per round (baseline, capture, fastack, each a child process
# driven by the same wrk script: `wrk -t1 -c32` for track, `-c8` for
# batches of 100), rounds alternating the backends. Prints one line a
# server and round (req/s, events/s, p50/p99 ms, CPU µs per event from
# /proc: the server's, and on PostgreSQL the database's processes' too),
# then the medians. JSON reports are kept in OUT.
#
# Usage: benches/scripts/three-servers.sh FASTACK_BIN CAPTURE_BIN [ROUNDS] [PROFILE] [OUT]
#   CAPTURE_BIN   benches/scripts/build-capture.sh prints it
#   ROUNDS        default 3; PROFILE track (default) | batch
#   BACKENDS      environment, default "sqlite postgres"
set -euo pipefail
fastack=$1 capture=$2 rounds=${3:-3} profile=${4:-track}
out=${5:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/../.." && pwd)
bench=${FASTACK_BENCH:-$(dirname "$fastack")/fastack-bench}
conns=32
[ "$profile" = batch ] && conns=8
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for backend in ${BACKENDS:-sqlite postgres}; do
    f="$out/$profile-$backend-$round.json"
    "$bench" --server "$fastack" --capture "$capture" --wrk "$here/benches/wrk/events.lua" \
      --backend "$backend" --profile "$profile" --connections "$conns" \
      --duration 8 --warmup 2 --out "$f" >/dev/null
    python3 - "$f" "$backend" "$round" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for name in ("baseline", "capture", "fastack"):
    x = r.get(name)
    if not x:
        continue
    cpu = x.get("server_cpu_us_per_event")
    db = x.get("database_cpu_us_per_event")
    print("%s\t%s\t%s\t%.0f\t%.0f\t%.2f\t%.2f\t%s\t%s\t%d" % (
        sys.argv[2], sys.argv[3], name, x["requests_per_sec"], x["events_per_sec"],
        x["p50_ms"], x["p99_ms"], "%.1f" % cpu if cpu is not None else "-",
        "%.1f" % db if db is not None else "-", sum(x["errors"].values())))
PY
  done
done | tee "$out/lines.tsv"
python3 - "$out/lines.tsv" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print("\nmedians: backend server req/s events/s p50 p99 cpu_us/event db_cpu_us/event")
for backend in dict.fromkeys(r[0] for r in rows):
    for name in ("baseline", "capture", "fastack"):
        sel = [r for r in rows if r[0] == backend and r[2] == name]
        if not sel:
            continue
        med = lambda i: statistics.median(float(r[i]) for r in sel) if all(r[i] != "-" for r in sel) else None
        fmt = lambda v, p: "-" if v is None else f"{v:.{p}f}"
        print(backend, name, fmt(med(3), 0), fmt(med(4), 0), fmt(med(5), 2), fmt(med(6), 2),
              fmt(med(7), 1), fmt(med(8), 1), sep="\t")
PY
echo "reports: $out"
