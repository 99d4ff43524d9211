#!/usr/bin/env python3
"""The lake as a table: files per tenant and date before and after
compaction, and what a reader pays to open and count it.

Two PostgreSQL nodes mirror to S3 (moto, or any S3 endpoint) with a flush
every 2 s and no compaction; 12,000 events occurring over 60 days arrive
over about a minute, alternating nodes. Then both stop and one node starts
with a maintenance round every second until every date holds one file.
Before and after: the table's version, live files, the most files a date
holds, the log's objects and bytes, and the median of 5 runs of opening
the table with the Python `deltalake` package and counting its rows.

    lake-files.py BIN S3_ENDPOINT [EVENTS] [DAYS]

Needs PostgreSQL on 127.0.0.1:5432 (user postgres) and a Python with
deltalake (FASTACK_TEST_PYTHON, as the tests use). Prints one JSON object.
"""

import json, os, statistics, subprocess, sys, tempfile, time, urllib.request, uuid
from datetime import datetime, timedelta, timezone

BIN, ENDPOINT = sys.argv[1], sys.argv[2]
EVENTS = int(sys.argv[3]) if len(sys.argv) > 3 else 12_000
DAYS = int(sys.argv[4]) if len(sys.argv) > 4 else 60
PORTS = (18211, 18212)
PYTHON = os.environ.get("FASTACK_TEST_PYTHON", "python3")
BUCKET = "lake-" + uuid.uuid4().hex[:10]
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}


def get(port: int, path: str) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read().decode()


def metric(port: int, name: str) -> float:
    for line in get(port, "/metrics").splitlines():
        if line.startswith(name) and ('sink="mirror"' in line or "{" not in line):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def start(env: dict, port: int) -> subprocess.Popen:
    env = dict(env, FASTACK_LISTEN=f"127.0.0.1:{port}")
    p = subprocess.Popen([BIN, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            get(port, "/readyz")
            return p
        except Exception:
            time.sleep(0.1)
    p.kill()
    raise SystemExit("a node did not become ready")


def reader(table: str) -> dict:
    """The table as `deltalake` sees it, and the median time to open and count it."""
    script = r"""
import json, os, statistics, sys, time
from deltalake import DeltaTable
uri, opts = sys.argv[1], json.loads(sys.argv[2])
times = []
for _ in range(5):
    t0 = time.perf_counter()
    dt = DeltaTable(uri, storage_options=opts)
    rows = dt.to_pyarrow_dataset().count_rows()
    times.append(time.perf_counter() - t0)
import pyarrow as pa
per_date = {}
for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist():
    d = str(a["partition.date"])
    per_date[d] = per_date.get(d, 0) + 1
print(json.dumps({"version": dt.version(), "rows": rows, "files": len(dt.file_uris()),
                  "dates": len(per_date), "most_files_a_date": max(per_date.values()),
                  "open_and_count_ms": round(statistics.median(times) * 1000, 1)}))
sys.stdout.flush()
os._exit(0)
"""
    opts = dict(KEYS, AWS_ENDPOINT_URL=ENDPOINT, AWS_ALLOW_HTTP="true")
    out = subprocess.run([PYTHON, "-c", script, table, json.dumps(opts)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def log_size(prefix: str) -> dict:
    """Objects and bytes of the table's log, listed through the S3 API
    (ListObjectsV2; moto answers it unsigned)."""
    import re
    objects, size, token = 0, 0, None
    while True:
        url = f"{ENDPOINT}/{BUCKET}?list-type=2&prefix={prefix}/_delta_log/"
        if token:
            url += "&continuation-token=" + urllib.request.quote(token)
        xml = urllib.request.urlopen(url, timeout=10).read().decode()
        sizes = [int(s) for s in re.findall(r"<Size>(\d+)</Size>", xml)]
        objects += len(sizes)
        size += sum(sizes)
        m = re.search(r"<NextContinuationToken>([^<]+)</NextContinuationToken>", xml)
        if not m:
            return {"log_objects": objects, "log_bytes": size}
        token = m.group(1)


def main() -> None:
    urllib.request.urlopen(urllib.request.Request(f"{ENDPOINT}/{BUCKET}", method="PUT"), timeout=10)
    work = tempfile.mkdtemp()
    db = "bench_" + uuid.uuid4().hex[:12]
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc", f"create database {db}"], check=True)
    env = {
        "PATH": os.environ["PATH"],
        "FASTACK_DATA_DIR": work,
        "FASTACK_LOG": "warn",
        "FASTACK_DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{db}",
        "FASTACK_ENC_KEY": "0ndMk5lrcDSSadOMl3dzDvQcWshfolmN22ked2wLSQE=",
        "FASTACK_MIRROR_URL": f"s3://{BUCKET}/lake",
        "FASTACK_MIRROR_FLUSH_SECS": "2",
        "FASTACK_S3_ENDPOINT": ENDPOINT,
        "FASTACK_S3_REGION": KEYS["AWS_REGION"],
        "FASTACK_S3_ACCESS_KEY_ID": KEYS["AWS_ACCESS_KEY_ID"],
        "FASTACK_S3_SECRET_ACCESS_KEY": KEYS["AWS_SECRET_ACCESS_KEY"],
    }
    nodes = [start(env, port) for port in PORTS]
    made = subprocess.run([BIN, "admin", "tenant", "create", "--name", "lake", "--plan", "enterprise",
                           "--json"], env=env, check=True, capture_output=True, text=True).stdout
    tenant_id = json.loads(made)["id"]
    out = subprocess.run([BIN, "admin", "key", "create", "--tenant", "lake"], env=env, check=True,
                         capture_output=True, text=True).stdout
    key = next(w for w in out.split() if w.startswith("fsk_"))
    now = datetime.now(timezone.utc)
    per, pace = 20, 0.1
    t0 = time.time()
    for r in range(EVENTS // per):
        batch = []
        for i in range(per):
            n = r * per + i
            at = now - timedelta(seconds=(n * 7919) % (DAYS * 86400))
            batch.append({"type": "track", "event": "Order Completed", "user_id": f"u{n % 500}",
                          "properties": {"total": n}, "occurred_at": at.isoformat(),
                          "idempotency_key": f"lake-{n}"})
        req = urllib.request.Request(f"http://127.0.0.1:{PORTS[r % 2]}/v1/core/batch",
                                     data=json.dumps({"batch": batch}).encode(), method="POST",
                                     headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()
        time.sleep(max(0.0, t0 + (r + 1) * pace - time.time()))
    deadline = time.time() + 300
    while time.time() < deadline:
        written = sum(metric(p, "fastack_mirror_events_written_total") for p in PORTS)
        owed = sum(metric(p, "fastack_outbox_depth") for p in PORTS)
        if written >= EVENTS and owed == 0:
            break
        time.sleep(1)
    races = sum(metric(p, "fastack_mirror_commit_races_total") for p in PORTS)
    for n in nodes:
        n.terminate()
        n.wait()
    table = f"s3://{BUCKET}/lake/tenant={tenant_id}"
    before = dict(reader(table), **log_size(f"lake/tenant={tenant_id}"), commit_races=races)
    node = start(dict(env, FASTACK_MIRROR_MAINTAIN_SECS="1"), PORTS[0])
    t1 = time.time()
    while time.time() < t1 + 600:
        time.sleep(2)
        seen = reader(table)
        if seen["most_files_a_date"] <= 1:
            break
    compaction_s = round(time.time() - t1, 1)
    node.terminate()
    node.wait()
    after = dict(reader(table), **log_size(f"lake/tenant={tenant_id}"))
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc",
                    f"drop database {db} with (force)"], check=False)
    print(json.dumps({"events": EVENTS, "days": DAYS, "before": before, "after": after,
                      "compaction_s": compaction_s}, indent=1))


if __name__ == "__main__":
    main()
