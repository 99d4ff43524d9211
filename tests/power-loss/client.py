#!/usr/bin/env python3
"""The load and the check of the power-loss test (tests/power-loss/run.sh).

Python 3 standard library only.

  client.py load   --url U --key K --state DIR --prefix P [--clients 4]
      Clients send batches (1 to --max-batch items, a tenth of them
      `identify`) and single `track`s, --pause-ms apart, every event with its own idempotency key (also kept
      in its properties/traits as "k", so a stored event names its key),
      until the node stops answering (each client stops at its first
      request left without an answer) or --max-seconds. Every request is
      written to DIR/sent-P.jsonl with its answer: the ids when it was
      answered 202, null when not.
  client.py resend --url U --key K --state DIR
      Sends every request left without an answer again, same body, same
      keys, until it is answered 202 (503 and broken connections are
      retried for --timeout seconds); records the answers.
  client.py check  --url U --key K --state DIR [--timeout 300]
      Reads every event back (GET /v1/core/events, paging) until every
      answered key is there or the timeout passes, then checks: each
      answered key stored exactly once, with the id it was answered with;
      no key stored twice; nothing stored that no request carried.
      Prints one JSON line; exits 1 when anything is missing or extra.
  client.py lazyfs-report LOGFILE
      The total of LazyFS's last `unsynced-data-report` and the files it
      named, as one JSON line.
"""

import argparse
import glob
import http.client
import json
import os
import random
import re
import sys
import threading
import time
import urllib.parse
from datetime import datetime, timedelta, timezone


def conn_for(url, timeout):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def post(conn, path, key, body):
    """(status, parsed body) or raises on a broken connection."""
    data = json.dumps(body).encode()
    conn.request(
        "POST",
        path,
        body=data,
        headers={
            "authorization": f"Bearer {key}",
            "content-type": "application/json",
        },
    )
    r = conn.getresponse()
    raw = r.read()
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = {"raw": raw.decode(errors="replace")}
    return r.status, parsed


def now_iso():
    return datetime.now(timezone.utc).isoformat()


def event(kind, key, n):
    user = f"user-{n % 13}"
    if kind == "identify":
        return {
            "type": "identify",
            "user_id": user,
            "traits": {"k": key, "plan": "pro"},
            "occurred_at": now_iso(),
            "idempotency_key": key,
        }
    return {
        "type": "track",
        "event": "Order Completed",
        "user_id": user,
        "properties": {"k": key, "total": 42.5, "currency": "EUR"},
        "occurred_at": now_iso(),
        "idempotency_key": key,
    }


def request_for(prefix, c, n, rng, max_batch):
    """(path, body, keys) of one request: a single track a fifth of the
    time, else a batch of 1-max_batch items, a tenth of them identify."""
    if rng.random() < 0.2:
        key = f"{prefix}-c{c}-{n}-t"
        body = event("track", key, n)
        del body["type"]
        return "/v1/core/track", body, [key]
    size = rng.randint(1, max_batch)
    keys = [f"{prefix}-c{c}-{n}-{i}" for i in range(size)]
    items = [
        event("identify" if rng.random() < 0.1 else "track", k, n + i)
        for i, k in enumerate(keys)
    ]
    return "/v1/core/batch", {"batch": items}, keys


def ids_of(path, answer):
    if path == "/v1/core/batch":
        return [i["id"] for i in answer["items"]]
    return [answer["id"]]


def load(args):
    out = os.path.join(args.state, f"sent-{args.prefix}.jsonl")
    lock = threading.Lock()
    records = []
    refused = []
    deadline = time.monotonic() + args.max_seconds

    def client(c):
        rng = random.Random(f"{args.prefix}-{c}")
        conn = conn_for(args.url, args.request_timeout)
        n = 0
        while time.monotonic() < deadline:
            if n and args.pause_ms:
                time.sleep(args.pause_ms / 1000)
            path, body, keys = request_for(args.prefix, c, n, rng, args.max_batch)
            n += 1
            rec = {"path": path, "body": body, "keys": keys, "ids": None, "status": None}
            try:
                status, answer = post(conn, path, args.key, body)
            except (OSError, http.client.HTTPException) as e:
                rec["error"] = type(e).__name__
                with lock:
                    records.append(rec)
                return  # the node is gone
            rec["status"] = status
            if status == 202:
                rec["ids"] = ids_of(path, answer)
            elif status == 503:
                pass  # nothing accepted: sent again after the restart
            else:
                rec["answer"] = answer
                with lock:
                    refused.append(rec)
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(out, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    answered = sum(len(r["keys"]) for r in records if r["ids"] is not None)
    unanswered = sum(1 for r in records if r["ids"] is None)
    print(
        json.dumps(
            {
                "requests": len(records),
                "answered_events": answered,
                "unanswered_requests": unanswered,
                "refused": len(refused),
            }
        )
    )
    if refused:
        print("refused requests (not 202/503):", file=sys.stderr)
        for r in refused[:5]:
            print(json.dumps({"status": r["status"], "answer": r["answer"]}), file=sys.stderr)
        return 1
    return 0


def read_records(state):
    files = sorted(glob.glob(os.path.join(state, "sent-*.jsonl")))
    out = []
    for f in files:
        with open(f) as fh:
            out.extend((f, i, json.loads(line)) for i, line in enumerate(fh))
    return files, out


def resend(args):
    files, recs = read_records(args.state)
    pending = [r for (_, _, r) in recs if r["ids"] is None]
    deadline = time.monotonic() + args.timeout
    duplicates = 0
    conn = conn_for(args.url, args.request_timeout)
    for r in pending:
        while True:
            try:
                status, answer = post(conn, r["path"], args.key, r["body"])
            except (OSError, http.client.HTTPException):
                status, answer = None, None
                conn.close()
                conn = conn_for(args.url, args.request_timeout)
            if status == 202:
                r["ids"] = ids_of(r["path"], answer)
                r["resent"] = True
                if r["path"] == "/v1/core/batch":
                    duplicates += sum(1 for i in answer["items"] if i.get("duplicate"))
                elif answer.get("duplicate"):
                    duplicates += 1
                break
            if status not in (None, 503) or time.monotonic() > deadline:
                print(
                    f"a request sent again was answered {status}: {json.dumps(answer)}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.2)
    # Write the answers back.
    by_file = {}
    for f, i, r in recs:
        by_file.setdefault(f, []).append(r)
    for f, rs in by_file.items():
        with open(f + ".tmp", "w") as fh:
            for r in rs:
                fh.write(json.dumps(r) + "\n")
        os.replace(f + ".tmp", f)
    print(json.dumps({"resent_requests": len(pending), "already_accepted_events": duplicates}))
    return 0


def read_all(url, key, timeout):
    now = datetime.now(timezone.utc)
    q = {
        "from": (now - timedelta(days=2)).isoformat(),
        "to": (now + timedelta(days=2)).isoformat(),
        "limit": "1000",
    }
    conn = conn_for(url, timeout)
    out = []
    cursor = None
    while True:
        params = dict(q)
        if cursor:
            params["cursor"] = cursor
        conn.request(
            "GET",
            "/v1/core/events?" + urllib.parse.urlencode(params),
            headers={"authorization": f"Bearer {key}"},
        )
        r = conn.getresponse()
        raw = r.read()
        if r.status != 200:
            raise RuntimeError(f"GET events answered {r.status}: {raw[:300]!r}")
        page = json.loads(raw)
        out.extend(page["events"])
        cursor = page.get("next_cursor")
        if not cursor:
            conn.close()
            return out


def key_of(e):
    for field in ("properties", "traits"):
        v = e.get(field) or {}
        if isinstance(v, dict) and "k" in v:
            return v["k"]
    return None


def check(args):
    _, recs = read_records(args.state)
    expected = {}
    sent_keys = set()
    unanswered = 0
    for _, _, r in recs:
        sent_keys.update(r["keys"])
        if r["ids"] is None:
            unanswered += 1
            continue
        for k, i in zip(r["keys"], r["ids"]):
            if k in expected and expected[k] != i:
                print(f"key {k} answered with two ids: {expected[k]} and {i}", file=sys.stderr)
                return 1
            expected[k] = i
    started = time.monotonic()
    deadline = started + args.timeout
    while True:
        events = read_all(args.url, args.key, args.request_timeout)
        stored = {}
        for e in events:
            stored.setdefault(key_of(e), []).append(e["id"])
        missing = [k for k in expected if k not in stored]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    readable_after = time.monotonic() - started
    # Settled: read once more, a second later, and judge that.
    time.sleep(1.0)
    events = read_all(args.url, args.key, args.request_timeout)
    stored = {}
    for e in events:
        stored.setdefault(key_of(e), []).append(e["id"])
    ids = [e["id"] for e in events]
    lost = sorted(k for k in expected if k not in stored)
    doubled = sorted(k for k, v in stored.items() if len(v) > 1)
    unknown = sorted(str(k) for k in stored if k not in sent_keys)
    unanswered_stored = sorted(k for k in stored if k in sent_keys and k not in expected)
    wrong_id = sorted(
        k for k, v in stored.items() if k in expected and len(v) == 1 and v[0] != expected[k]
    )
    result = {
        "answered_events": len(expected),
        "stored_events": len(events),
        "readable_once": sum(1 for k in expected if len(stored.get(k, [])) == 1),
        "lost": len(lost),
        "doubled": len(doubled),
        "ids_stored_twice": len(ids) - len(set(ids)),
        "unknown": len(unknown),
        "stored_unanswered": len(unanswered_stored),
        "wrong_id": len(wrong_id),
        "unanswered_requests_left": unanswered,
        "readable_after_s": round(readable_after, 2),
    }
    ok = (
        not lost
        and not doubled
        and not unknown
        and not unanswered_stored
        and not wrong_id
        and result["ids_stored_twice"] == 0
        and unanswered == 0
        and len(events) == len(expected)
    )
    result["ok"] = ok
    print(json.dumps(result))
    if not ok:
        for name, ks in (
            ("lost", lost),
            ("doubled", doubled),
            ("unknown", unknown),
            ("stored_unanswered", unanswered_stored),
            ("wrong_id", wrong_id),
        ):
            if ks:
                print(f"{name}: {ks[:20]}", file=sys.stderr)
        return 1
    return 0


def lazyfs_report(args):
    total = None
    files = set()
    synced = False
    with open(args.logfile, errors="replace") as f:
        for line in f:
            m = re.search(r"total number of bytes un-fsynced: (\d+) bytes", line)
            if m:
                total = int(m.group(1))
            m = re.search(r"=> file: '(.*)'", line)
            if m:
                files.add(os.path.basename(m.group(1)))
            if "all data blocks are synced" in line:
                synced = True
                total = 0
    print(json.dumps({"unsynced_bytes": total, "files": sorted(files), "all_synced": synced}))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("load", "resend", "check"):
        s = sub.add_parser(name)
        s.add_argument("--url", required=True)
        s.add_argument("--key", required=True)
        s.add_argument("--state", required=True)
        s.add_argument("--request-timeout", type=float, default=10.0)
        if name == "load":
            s.add_argument("--prefix", required=True)
            s.add_argument("--clients", type=int, default=4)
            s.add_argument("--max-seconds", type=float, default=120.0)
            s.add_argument("--max-batch", type=int, default=20)
            s.add_argument("--pause-ms", type=float, default=20.0)
        else:
            s.add_argument("--timeout", type=float, default=300.0)
    s = sub.add_parser("lazyfs-report")
    s.add_argument("logfile")
    args = p.parse_args()
    return {"load": load, "resend": resend, "check": check, "lazyfs-report": lazyfs_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
