#!/usr/bin/env python3
"""How long forgetting a person takes, among millions of other events.

Loads one tenant with EVENTS events spread over the last 13 months (one
partition a month) — among them PERSON events of one person, `bench-person`,
with a contact and two identities — then erases that person through the API
and reports the job's own `execution_time_ms` (the database work: every
partition searched and cleaned, the contact, the outbox, the payloads, the
verification pass; no archive and no lake here, they are reported apart),
the wall time from request to completion, and the certificate's counts.
Then it erases 5,000 other people in one request.

The bulk rows are written straight into the partitions (SQL on the stopped
node's files for SQLite, `INSERT … SELECT generate_series` on PostgreSQL):
loading five million events through the API would take minutes and measure
ingestion, not erasure.

    erasure.py BIN [sqlite|postgres] [EVENTS] [PERSON]

BIN is a release build of fastack. PostgreSQL at FASTACK_BENCH_PG (default
postgres://postgres@127.0.0.1:5432/test; a database of the run's own is
created and dropped), Redis at FASTACK_BENCH_REDIS.
"""

import json, os, subprocess, sys, tempfile, time, urllib.request, uuid
from datetime import datetime, timedelta, timezone

BIN = sys.argv[1]
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "sqlite"
EVENTS = int(sys.argv[3]) if len(sys.argv) > 3 else 5_000_000
PERSON = int(sys.argv[4]) if len(sys.argv) > 4 else 1_000
MONTHS = 13
PORT = 18193
BASE = f"http://127.0.0.1:{PORT}"
PG = os.environ.get("FASTACK_BENCH_PG", "postgres://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("FASTACK_BENCH_REDIS", "redis://127.0.0.1:6379")


def request(method: str, path: str, key: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(BASE + path, data=data, method=method)
    req.add_header("authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read() or b"null")


def start(env: dict) -> subprocess.Popen:
    p = subprocess.Popen([BIN, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(BASE + "/readyz", timeout=1)
            return p
        except Exception:
            time.sleep(0.1)
    p.kill()
    raise SystemExit("the node did not become ready")


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    p.wait(timeout=60)


def cli(env: dict, *args: str) -> dict:
    out = subprocess.run([BIN, "admin", "--json", *args], env=env, check=True, capture_output=True)
    return json.loads(out.stdout)


def month_starts(now: datetime) -> list:
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    out = []
    for k in range(MONTHS):
        y, m = first.year, first.month - k
        while m <= 0:
            y, m = y - 1, m + 12
        out.append(first.replace(year=y, month=m))
    return out


def wait_job(key: str, job_id: str) -> tuple:
    started = time.monotonic()
    while True:
        job = request("GET", f"/v1/core/jobs/{job_id}", key)
        if job["status"] in ("completed", "failed"):
            return job, time.monotonic() - started
        time.sleep(0.02)


def load_sqlite(work: str, tenant: str, contact: str, months: list) -> None:
    """Rows straight into the month tables of the stopped node's file."""
    t = uuid.UUID(tenant).hex
    c = uuid.UUID(contact).hex
    per_month = (EVENTS - PERSON) // MONTHS
    theirs = PERSON // MONTHS
    script = [".output /dev/null", "PRAGMA journal_mode=WAL;", ".output stdout", "BEGIN;"]
    now_us = int(datetime.now(timezone.utc).timestamp() * 1_000_000)
    for k, start in enumerate(months):
        table = f"tracked_events_y{start.year:04d}m{start.month:02d}_r37"
        base = int(start.timestamp() * 1_000_000)
        span = 27 * 24 * 3600 * 1_000_000
        n_theirs = theirs + (PERSON - theirs * MONTHS if k == 0 else 0)
        for n, who, contact_sql in (
            (per_month, "'u-' || (i % 100000)", "CAST(printf('%016d', i % 100000) AS BLOB)"),
            (n_theirs, "'bench-person'", f"x'{c}'"),
        ):
            script.append(
                f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) "
                f"INSERT INTO {table} (tenant_id, occurred_at, id, retention_class, kind, event, contact_id, "
                f"user_id, anonymous_id, properties, occurred_offset_s, received_at, idempotency_key) "
                f"SELECT x'{t}', min({base} + abs(random() % {span}), {now_us} - 3600000000), randomblob(16), 37, "
                f"'track', 'Page Viewed', {contact_sql}, {who}, NULL, '{{\"path\":\"/pricing\"}}', 0, {now_us}, "
                f"'bulk-{k}-' || {who} || '-' || i FROM s;"
            )
    # The other people: 100,000 contacts, each with its user id.
    script.append(
        f"WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < 99999) "
        f"INSERT INTO contacts (id, tenant_id, merged_into, traits, created_at, updated_at) "
        f"SELECT CAST(printf('%016d', i) AS BLOB), x'{t}', NULL, '{{}}', {now_us}, {now_us} FROM s;"
    )
    script.append(
        f"WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < 99999) "
        f"INSERT INTO contact_identities (tenant_id, kind, value, contact_id) "
        f"SELECT x'{t}', 1, 'u-' || i, CAST(printf('%016d', i) AS BLOB) FROM s;"
    )
    script.append(
        f"INSERT INTO contacts (id, tenant_id, merged_into, traits, created_at, updated_at) "
        f"VALUES (x'{c}', x'{t}', NULL, '{{\"email\":\"p@example.com\"}}', {now_us}, {now_us});"
    )
    script.append(
        f"INSERT INTO contact_identities (tenant_id, kind, value, contact_id) VALUES "
        f"(x'{t}', 1, 'bench-person', x'{c}'), (x'{t}', 2, 'bench-device', x'{c}');"
    )
    script.append("COMMIT;")
    subprocess.run(["sqlite3", os.path.join(work, "fastack.db")], input="\n".join(script).encode(), check=True)


def load_postgres(url: str, tenant: str, contact: str, months: list) -> None:
    per_month = (EVENTS - PERSON) // MONTHS
    theirs = PERSON // MONTHS
    sql = ["BEGIN;"]
    for k, start in enumerate(months):
        n_theirs = theirs + (PERSON - theirs * MONTHS if k == 0 else 0)
        for n, who, contact_sql in (
            (per_month, "'u-' || (i % 100000)", "lpad((i % 100000)::text, 32, '0')::uuid"),
            (n_theirs, "'bench-person'", f"'{contact}'::uuid"),
        ):
            sql.append(
                f"INSERT INTO tracked_events (tenant_id, occurred_at, id, retention_class, kind, event, contact_id, "
                f"user_id, anonymous_id, properties, occurred_offset_s, received_at, idempotency_key) "
                f"SELECT '{tenant}', least(timestamptz '{start.isoformat()}' + random() * interval '27 days', "
                f"now() - interval '1 hour'), gen_random_uuid(), 37, 'track', 'Page Viewed', {contact_sql}, {who}, "
                f"NULL, '{{\"path\":\"/pricing\"}}', 0, now(), 'bulk-{k}-' || {who} || '-' || i "
                f"FROM generate_series(1, {n}) i;"
            )
    # The other people: 100,000 contacts, each with its user id.
    sql.append(
        f"INSERT INTO contacts (id, tenant_id, merged_into, traits, created_at, updated_at) "
        f"SELECT lpad(i::text, 32, '0')::uuid, '{tenant}', NULL, '{{}}', now(), now() "
        f"FROM generate_series(0, 99999) i;"
    )
    sql.append(
        f"INSERT INTO contact_identities (tenant_id, kind, value, contact_id) "
        f"SELECT '{tenant}', 1, 'u-' || i, lpad(i::text, 32, '0')::uuid FROM generate_series(0, 99999) i;"
    )
    sql.append(
        f"INSERT INTO contacts (id, tenant_id, merged_into, traits, created_at, updated_at) "
        f"VALUES ('{contact}', '{tenant}', NULL, '{{\"email\":\"p@example.com\"}}', now(), now());"
    )
    sql.append(
        f"INSERT INTO contact_identities (tenant_id, kind, value, contact_id) VALUES "
        f"('{tenant}', 1, 'bench-person', '{contact}'), ('{tenant}', 2, 'bench-device', '{contact}');"
    )
    sql.append("COMMIT;")
    sql.append("VACUUM ANALYZE;")
    subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", url], input="\n".join(sql).encode(), check=True)


def main() -> None:
    work = tempfile.mkdtemp()
    env = {
        "PATH": os.environ["PATH"],
        "FASTACK_DATA_DIR": work,
        "FASTACK_LISTEN": f"127.0.0.1:{PORT}",
        "FASTACK_LOG": "warn",
        "FASTACK_BOOTSTRAP": "false",
        "FASTACK_ENC_KEY": "ZmFzdGFjay1iZW5jaC1tYXN0ZXIta2V5LTMyLWJ5dGVzIQ==",
    }
    db = None
    if BACKEND == "postgres":
        db = f"fastack_erasure_{uuid.uuid4().hex[:12]}"
        subprocess.run(["psql", "-q", PG, "-c", f"CREATE DATABASE {db}"], check=True)
        url = PG.rsplit("/", 1)[0] + "/" + db
        env["FASTACK_DATABASE_URL"] = url
        env["FASTACK_REDIS_URL"] = REDIS
        env["FASTACK_REDIS_PREFIX"] = db
    try:
        node = start(env)
        tenant = cli(env, "tenant", "create", "--name", "bench", "--plan", "enterprise")["id"]
        key = cli(env, "key", "create", "--tenant", "bench")["secret"]
        # One event a month through the API: each month's partition exists.
        months = month_starts(datetime.now(timezone.utc))
        request(
            "POST",
            "/v1/core/batch",
            key,
            {
                "batch": [
                    {
                        "type": "track",
                        "event": "Seed",
                        "user_id": "seed",
                        "occurred_at": (m + timedelta(days=1)).isoformat(),
                        "idempotency_key": f"seed-{i}",
                    }
                    for i, m in enumerate(months)
                ]
            },
        )
        frm, to = months[-1].isoformat(), (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
        for _ in range(200):
            got = request("GET", f"/v1/core/events?from={frm.replace('+', '%2B')}&to={to.replace('+', '%2B')}", key)
            if len(got["events"]) == MONTHS:
                break
            time.sleep(0.1)
        contact = str(uuid.uuid4())
        loaded = time.monotonic()
        if BACKEND == "sqlite":
            stop(node)
            load_sqlite(work, tenant, contact, months)
            node = start(env)
        else:
            load_postgres(env["FASTACK_DATABASE_URL"], tenant, contact, months)
        load_s = time.monotonic() - loaded

        asked = request("POST", "/v1/core/erasures", key, {"user_ids": ["bench-person"]})
        job, wall = wait_job(key, asked["job_id"])
        stores = job["result"]["stores"] if job["status"] == "completed" else {}
        one = {
            "status": job["status"],
            "execution_time_ms": job.get("execution_time_ms"),
            "wall_s": round(wall, 3),
            "events_removed": stores.get("tracked_events", {}).get("events_removed"),
            "months": len(stores.get("tracked_events", {}).get("by_month", {})),
            "identities_removed": stores.get("contacts", {}).get("identities_removed"),
            "error": job["metadata"].get("error"),
        }
        people = [f"u-{i}" for i in range(5_000)]
        asked = request("POST", "/v1/core/erasures", key, {"user_ids": people})
        job, wall = wait_job(key, asked["job_id"])
        stores = job["result"]["stores"] if job["status"] == "completed" else {}
        many = {
            "status": job["status"],
            "execution_time_ms": job.get("execution_time_ms"),
            "wall_s": round(wall, 3),
            "events_removed": stores.get("tracked_events", {}).get("events_removed"),
            "error": job["metadata"].get("error"),
        }
        stop(node)
        print(
            json.dumps(
                {
                    "backend": BACKEND,
                    "events": EVENTS,
                    "person_events": PERSON,
                    "months": MONTHS,
                    "load_s": round(load_s, 1),
                    "one_person": one,
                    "five_thousand_people": many,
                },
                indent=2,
            )
        )
    finally:
        if db:
            subprocess.run(["psql", "-q", PG, "-c", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"], check=False)


if __name__ == "__main__":
    main()
