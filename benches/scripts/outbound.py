#!/usr/bin/env python3
"""Outbound throughput: AMQP publishes with confirms, and webhook deliveries
to a local receiver that answers 2xx at once. Starts a real `fastack serve`
(PostgreSQL + Redis + RabbitMQ), sends EVENTS events in batches of 100, and
reads the server's own /metrics:

  - fastack_amqp_published_total over time -> messages/s with confirms;
  - fastack_webhook_attempts_total{outcome="delivered"} -> deliveries/s;
  - fastack_webhook_first_attempt_lag_seconds -> p95 of outbox row written ->
    first attempt sent.

Usage: benches/scripts/outbound.py [EVENTS] [EVENTS_PER_SEC]
(release build required; without a rate, events are sent as fast as accepted,
which measures throughput; with one, the latency at that load)
"""
import json, os, re, subprocess, sys, time, urllib.request, uuid

BIN = os.path.join(os.path.dirname(__file__), "..", "..", "target", "release", "fastack")
BENCH = os.path.join(os.path.dirname(BIN), "fastack-bench")
EVENTS = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
RATE = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
run = "o" + uuid.uuid4().hex[:10]
db = f"fastack_out_{run}"
subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc", f"CREATE DATABASE {db}"], check=True)
env = {
    "PATH": os.environ["PATH"],
    "FASTACK_DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{db}",
    "FASTACK_REDIS_URL": "redis://127.0.0.1:6379",
    "FASTACK_REDIS_PREFIX": run,
    "FASTACK_ENC_KEY": "ZmFzdGFjay1iZW5jaC1tYXN0ZXIta2V5LTMyLWJ5dGVzIQ==",
    "FASTACK_AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/%2f",
    "FASTACK_CLOUDEVENTS_SOURCE": "//fastack/bench",
    "FASTACK_JOB_EVENTS_EXCHANGE": f"{run}.job",
    "FASTACK_CORE_EVENTS_EXCHANGE": f"{run}.core",
    "FASTACK_LISTEN": "127.0.0.1:0",
    "FASTACK_WEBHOOK_ALLOW_PRIVATE": "true",
    "FASTACK_BOOTSTRAP": "false",
    "FASTACK_LOG": "info",
}

def spawn(args, marker, extra=None, exe=BIN):
    p = subprocess.Popen([exe] + args, env={**env, **(extra or {})}, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        if marker in line and "addr=" in line:
            addr = line.split("addr=")[1].split()[0]
            import threading
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, addr
    raise SystemExit("child did not start")

def admin(*args):
    out = subprocess.run([BIN, "admin", "--json", *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)

admin("tenant", "create", "--name", "out", "--plan", "enterprise")
key = admin("key", "create", "--tenant", "out")["secret"]
receiver, raddr = spawn(["baseline"], "baseline listening", exe=BENCH)
admin("webhook", "add", "--tenant", "out", "--url", f"http://{raddr}/hook", "--events", "core.event.tracked")
server, addr = spawn(["serve"], "fastack listening")

def metrics():
    text = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
    def value(pattern):
        m = re.search(pattern + r" ([0-9.e+]+)", text)
        return float(m.group(1)) if m else 0.0
    buckets = [(float(le), float(v)) for le, v in re.findall(r'fastack_webhook_first_attempt_lag_seconds_bucket\{le="([0-9.e+-]+)"\} ([0-9.]+)', text)]
    return value("fastack_amqp_published_total"), value(r'fastack_webhook_attempts_total\{outcome="delivered"\}'), buckets

def post(body):
    req = urllib.request.Request(f"http://{addr}/v1/core/batch", data=json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    urllib.request.urlopen(req).read()

now = time.time()
t0 = time.time()
for b in range(EVENTS // 100):
    if RATE:
        due = t0 + b * 100 / RATE
        if due > time.time():
            time.sleep(due - time.time())
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + "Z"
    post({"batch": [{"type": "track", "event": "E", "user_id": f"u{i % 500}", "properties": {"n": i},
                     "occurred_at": ts, "idempotency_key": f"{run}-{b}-{i}"} for i in range(100)]})
sent = time.time() - t0
samples = []
while True:
    pub, dlv, buckets = metrics()
    samples.append((time.time(), pub, dlv))
    if pub >= EVENTS and dlv >= EVENTS:
        break
    if time.time() - t0 > 600:
        break
    time.sleep(0.25)

def rate(idx):
    pts = [(t, v[idx - 1]) for t, *v in samples if 0 < v[idx - 1] < EVENTS]
    pts = [(t, v) for t, v in [(s[0], s[idx]) for s in samples] if 0 < v < EVENTS]
    if len(pts) < 2:
        return 0.0
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

total = buckets[-1][1] if buckets else 0
p95 = next((le for le, v in buckets if total and v >= 0.95 * total), float("nan"))
p50 = next((le for le, v in buckets if total and v >= 0.50 * total), float("nan"))
print(json.dumps({
    "events": EVENTS,
    "offered_events_per_sec": RATE or "max",
    "accept_seconds": round(sent, 2),
    "amqp_published": samples[-1][1],
    "amqp_messages_per_sec": round(rate(1)),
    "webhook_delivered": samples[-1][2],
    "webhook_deliveries_per_sec": round(rate(2)),
    "first_attempt_lag_p50_le_seconds": p50,
    "first_attempt_lag_p95_le_seconds": p95,
}, indent=2))
server.terminate(); receiver.terminate()
server.wait(); receiver.wait()
subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc", f"DROP DATABASE {db} WITH (FORCE)"])
