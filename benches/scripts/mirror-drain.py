#!/usr/bin/env python3
"""The Parquet mirror's own throughput: events written to Parquet per second.

Loads N events into a node whose mirror never flushes (so they wait in the
outbox), restarts it with the default flush size (100,000 events; age
1 s, so the last partial batch does not wait 60 s) and times the
drain: from the restarted node's first answer until the mirror owes
nothing, by `fastack_outbox_depth{sink="mirror"}` and
`fastack_mirror_events_written_total`.

    mirror-drain.py BIN [sqlite|postgres] [EVENTS]
"""

import json, os, signal, subprocess, sys, tempfile, threading, time, urllib.request, uuid
from datetime import datetime, timezone

BIN = sys.argv[1]
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "sqlite"
EVENTS = int(sys.argv[3]) if len(sys.argv) > 3 else 200_000
PORT = 18191
BASE = f"http://127.0.0.1:{PORT}"


def metric(name: str) -> float:
    text = urllib.request.urlopen(BASE + "/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            if name.startswith("fastack_outbox_depth") and 'sink="mirror"' not in line:
                continue
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def start(env: dict) -> subprocess.Popen:
    p = subprocess.Popen([BIN, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(BASE + "/readyz", timeout=1)
            return p
        except Exception:
            time.sleep(0.1)
    p.kill()
    raise SystemExit("the node did not become ready")


def main() -> None:
    try:
        urllib.request.urlopen(BASE + "/readyz", timeout=1)
        raise SystemExit(f"something already answers on {BASE}")
    except OSError:
        pass
    work = tempfile.mkdtemp()
    env = {
        "PATH": os.environ["PATH"],
        "FASTACK_DATA_DIR": work,
        "FASTACK_LISTEN": f"127.0.0.1:{PORT}",
        "FASTACK_LOG": "warn",
        "FASTACK_MIRROR_URL": f"file://{work}/lake",
    }
    if BACKEND == "postgres":
        db = "bench_" + uuid.uuid4().hex[:12]
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc", f"create database {db}"], check=True)
        env["FASTACK_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{db}"
        env["FASTACK_ENC_KEY"] = "bWlycm9yLWRyYWluLWJlbmNoLWtleS0zMi1ieXRlcyE="
    hold = dict(env, FASTACK_MIRROR_FLUSH_ROWS="1000000000", FASTACK_MIRROR_FLUSH_SECS="1000000")
    node = start(hold)
    # A tenant of its own (the enterprise plan: no rate limit in the way).
    subprocess.run([BIN, "admin", "tenant", "create", "--name", "drain", "--plan", "enterprise"],
                   env=env, check=True, capture_output=True)
    out = subprocess.run([BIN, "admin", "key", "create", "--tenant", "drain"], env=env, check=True,
                         capture_output=True, text=True).stdout
    key = next(w for w in out.split() if w.startswith("fsk_"))
    now = datetime.now(timezone.utc).isoformat()
    per, threads = 500, 4

    def load(t: int) -> None:
        for r in range(t, EVENTS // per, threads):
            batch = [
                {"type": "track", "event": "Order Completed", "user_id": f"u{i % 1000}",
                 "properties": {"total": i, "currency": "EUR", "items": [1, 2, 3]},
                 "occurred_at": now, "idempotency_key": f"d-{r}-{i}"}
                for i in range(per)
            ]
            req = urllib.request.Request(BASE + "/v1/core/batch", data=json.dumps({"batch": batch}).encode(),
                                         headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()

    ts = [threading.Thread(target=load, args=(t,)) for t in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    while metric("fastack_outbox_depth") < EVENTS:
        time.sleep(0.5)
    node.send_signal(signal.SIGTERM)
    node.wait()
    # Every owed row is old by now, so each pump is due: batches of 100,000
    # events, and the last, smaller one goes at once instead of waiting out
    # the default 60 s age.
    node = start(dict(env, FASTACK_MIRROR_FLUSH_SECS="1"))
    t0 = time.monotonic()
    while metric("fastack_outbox_depth") > 0 or metric("fastack_mirror_events_written_total") < EVENTS:
        time.sleep(0.05)
    took = time.monotonic() - t0
    files = sum(len(f) for _, _, f in os.walk(os.path.join(work, "lake")))
    size = sum(os.path.getsize(os.path.join(d, x)) for d, _, fs in os.walk(os.path.join(work, "lake")) for x in fs)
    node.send_signal(signal.SIGTERM)
    node.wait()
    print(f"{BACKEND}\t{EVENTS} events\t{took:.2f} s\t{EVENTS / took:,.0f} events/s\t{files} files\t{size / EVENTS:.1f} bytes/event")


main()
