#!/usr/bin/env python3
"""The table's log after a million events: its versions, checkpoints, size,
and the time `deltalake` takes to open the table and count its rows.

One embedded node mirrors to a local directory with a flush every second
(a commit a second while the load lasts, the log's worst case short of a
flush per event); EVENTS events over 30 days arrive from 4 clients in
batches of 500. Once the mirror owes nothing the node stops and the log is
measured: objects and bytes under `_delta_log/`, the last checkpoint, and
the median of 5 runs of opening the table and counting its rows. Then the
node starts again with a maintenance round a second, until every date holds
one file (the events fit the size target), and the same is measured after
that compaction.

    lake-log.py BIN [EVENTS]

Needs a Python with deltalake (FASTACK_TEST_PYTHON). Prints one JSON object.
"""

import json, os, subprocess, sys, tempfile, threading, time, urllib.request
from datetime import datetime, timedelta, timezone

BIN = sys.argv[1]
EVENTS = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
PORT = 18221
BASE = f"http://127.0.0.1:{PORT}"
PYTHON = os.environ.get("FASTACK_TEST_PYTHON", "python3")


def metric(name: str) -> float:
    for line in urllib.request.urlopen(BASE + "/metrics", timeout=5).read().decode().splitlines():
        if line.startswith(name) and ('sink="mirror"' in line or "{" not in line):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def start(env: dict) -> subprocess.Popen:
    node = subprocess.Popen([BIN, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(BASE + "/readyz", timeout=1)
            break
        except Exception:
            time.sleep(0.1)
    return node


READ = r"""
import json, os, statistics, sys, time
from collections import Counter
from deltalake import DeltaTable
if sys.argv[2] == "files":
    t0 = time.perf_counter()
    dt = DeltaTable(sys.argv[1])
    dates = Counter(str(d) for d in dt.get_add_actions(flatten=True).column("partition.date").to_pylist())
    print(json.dumps({"version": dt.version(), "files": sum(dates.values()), "dates": len(dates),
                      "most_files_a_date": max(dates.values()),
                      "open_ms": round((time.perf_counter() - t0) * 1000, 1)}))
else:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dt = DeltaTable(sys.argv[1])
        rows = dt.to_pyarrow_dataset().count_rows()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"version": dt.version(), "rows": rows, "files": len(dt.file_uris()),
                      "open_and_count_ms": round(statistics.median(times) * 1000, 1)}))
sys.stdout.flush()
os._exit(0)
"""


def read(table: str, what: str) -> dict:
    return json.loads(subprocess.run([PYTHON, "-c", READ, table, what], check=True, capture_output=True,
                                     text=True).stdout)


def log_size(table: str) -> dict:
    log = os.path.join(table, "_delta_log")
    names = os.listdir(log)
    last = json.load(open(os.path.join(log, "_last_checkpoint"))) if "_last_checkpoint" in names else None
    return {"log_objects": len(names),
            "log_bytes": sum(os.path.getsize(os.path.join(log, n)) for n in names),
            "checkpoints": sum(n.endswith(".checkpoint.parquet") for n in names),
            "last_checkpoint": last}


def main() -> None:
    work = tempfile.mkdtemp()
    lake = os.path.join(work, "lake")
    env = {
        "PATH": os.environ["PATH"],
        "FASTACK_DATA_DIR": work,
        "FASTACK_LISTEN": f"127.0.0.1:{PORT}",
        "FASTACK_LOG": "warn",
        "FASTACK_MIRROR_URL": f"file://{lake}",
        "FASTACK_MIRROR_FLUSH_SECS": "1",
    }
    node = start(env)
    subprocess.run([BIN, "admin", "tenant", "create", "--name", "log", "--plan", "enterprise"],
                   env=env, check=True, capture_output=True)
    out = subprocess.run([BIN, "admin", "key", "create", "--tenant", "log"], env=env, check=True,
                         capture_output=True, text=True).stdout
    key = next(w for w in out.split() if w.startswith("fsk_"))
    now = datetime.now(timezone.utc)
    per, threads = 500, 4

    def load(t: int) -> None:
        for r in range(t, EVENTS // per, threads):
            batch = []
            for i in range(per):
                n = r * per + i
                at = now - timedelta(seconds=(n * 7919) % (30 * 86400))
                batch.append({"type": "track", "event": "Order Completed", "user_id": f"u{n % 1000}",
                              "properties": {"total": n}, "occurred_at": at.isoformat(),
                              "idempotency_key": f"log-{n}"})
            req = urllib.request.Request(BASE + "/v1/core/batch", data=json.dumps({"batch": batch}).encode(),
                                         method="POST", headers={"authorization": f"Bearer {key}",
                                                                 "content-type": "application/json"})
            for _ in range(20):
                try:
                    urllib.request.urlopen(req, timeout=60).read()
                    break
                except urllib.error.HTTPError as e:
                    if e.code != 503:
                        raise
                    time.sleep(0.2)

    t0 = time.time()
    workers = [threading.Thread(target=load, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    loaded_s = time.time() - t0
    while metric("fastack_mirror_events_written_total") < EVENTS or metric("fastack_outbox_depth") > 0:
        time.sleep(1)
    mirrored_s = time.time() - t0
    node.terminate()
    node.wait()
    table = next(os.path.join(lake, d) for d in os.listdir(lake) if d.startswith("tenant="))
    before = dict(read(table, "count"), **log_size(table))
    # Compaction: maintenance rounds a second until each date is one file.
    node = start(dict(env, FASTACK_MIRROR_MAINTAIN_SECS="1"))
    t1 = time.time()
    while time.time() < t1 + 1800:
        time.sleep(5)
        if read(table, "files")["most_files_a_date"] <= 1:
            break
    compaction_s = round(time.time() - t1, 1)
    node.terminate()
    node.wait()
    after = dict(read(table, "count"), **read(table, "files"), **log_size(table))
    print(json.dumps({"events": EVENTS, "load_s": round(loaded_s, 1), "mirrored_s": round(mirrored_s, 1),
                      "before": before, "compaction_s": compaction_s, "after": after}, indent=1))

if __name__ == "__main__":
    main()
