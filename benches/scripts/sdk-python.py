#!/usr/bin/env python3
"""The Python SDK's Tracker against a real server: what ONE Python process
with ONE Tracker delivers, and what one `tracker.track()` costs the caller.

Starts `fastack serve` (embedded SQLite, or PostgreSQL + Redis with
--postgres), creates an enterprise tenant and a key, then measures:

  (a) throughput: track N events as fast as the loop goes (the queue holds all
      N, so nothing is dropped), flush(), and divide N by the time from the
      first track() to the end of flush() -> events/s accepted (202, durable);
  (b) the cost of one track() call to the application: the time of many calls
      divided by their count, while the worker is sending (two figures: the
      calls of run (a), with the worker saturated; and a run at a fixed
      offered rate, half of what (a) reached by default, closer to an
      application).

The same event as `fastack-bench --profile batch` (an "Order Completed" with
four properties), so the figures compare with:

  target/release/fastack-bench --profile batch --connections 8 --no-baseline --backend sqlite
  target/release/fastack-bench --profile batch --connections 8 --no-baseline --backend postgres

(printed at the end; --compare runs the one of the chosen backend right after,
on the same binary). Targets: (a) >= 80 % of `fastack-bench --profile batch`,
(b) < 20 µs.

Usage (the SDK's virtualenv has its dependencies; any Python >= 3.9 with httpx
and attrs will do, the SDK is imported from clients/python):

  clients/python/.venv/bin/python benches/scripts/sdk-python.py [--events 300000]
      [--bin target/release/fastack] [--postgres postgres://postgres@127.0.0.1:5432/test]
      [--redis redis://127.0.0.1:6379] [--max-inflight 4,1] [--compare]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "clients" / "python"))

from fastack import Tracker


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_bin = REPO / "target" / "release" / "fastack"
    if not default_bin.exists():
        default_bin = REPO / "target" / "debug" / "fastack"
    p.add_argument(
        "--bin",
        default=os.environ.get("FASTACK_BIN") or str(default_bin),
        help="fastack binary",
    )
    p.add_argument("--events", type=int, default=300_000, help="events of run (a)")
    p.add_argument(
        "--warmup", type=int, default=20_000, help="events sent before measuring"
    )
    p.add_argument(
        "--calls", type=int, default=60_000, help="track() calls of the paced run (b)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=0,
        help="offered events/s of the paced run (b); default: half of what run (a) reached",
    )
    p.add_argument(
        "--max-inflight",
        default="4,1",
        help="Tracker(max_inflight=...) values for run (a), comma-separated (4 is the default ceiling, "
        "the tracker finds how many pay; 1 is one batch at a time)",
    )
    p.add_argument("--max-batch", type=int, default=500, help="Tracker(max_batch=...)")
    p.add_argument(
        "--postgres",
        metavar="URL",
        help="PostgreSQL server: a fresh database is created and dropped",
    )
    p.add_argument(
        "--redis",
        metavar="URL",
        default="redis://127.0.0.1:6379",
        help="Redis, with --postgres",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="then run `fastack-bench --profile batch` (same backend)",
    )
    p.add_argument(
        "--duration",
        type=int,
        default=15,
        help="--duration of the compared fastack-bench",
    )
    return p.parse_args()


class Server:
    def __init__(self, binary: str, env: dict[str, str]) -> None:
        self.binary = binary
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.addr = ""

    def admin(self, *args: str) -> dict:
        out = subprocess.run(  # the return code is checked below
            [self.binary, "admin", "--json", *args],
            env=self.env,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise SystemExit(f"fastack admin {' '.join(args)}: {out.stderr}")
        return json.loads(out.stdout)

    def start(self, log_path: Path) -> None:
        log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, "serve"], env=self.env, stdout=log, stderr=log
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"fastack serve exited:\n{log_path.read_text()[-3000:]}"
                )
            m = re.search(
                r"fastack listening addr=(\S+)", log_path.read_text(errors="replace")
            )
            if m:
                self.addr = m.group(1)
                return
            time.sleep(0.05)
        raise SystemExit("fastack serve did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def psql(url: str, sql: str) -> None:
    subprocess.run(["psql", url, "-qc", sql], check=True, capture_output=True)


def track_loop(tracker: Tracker, n: int, start: int, rate: float = 0.0) -> float:
    """Tracks n events (paced at `rate` events/s when > 0); returns the time
    spent inside track() calls."""
    props = {"total": 129.9, "currency": "EUR", "items": 3}
    spent = 0.0
    perf = time.perf_counter
    if rate <= 0:
        t0 = perf()
        for i in range(start, start + n):
            tracker.track(
                "Order Completed",
                user_id=f"user-{i % 5000}",
                properties={"order_id": f"o-{i}", **props},
            )
        return perf() - t0
    # Paced: calls in bursts of 100, then sleep until the schedule says so.
    t_start = perf()
    for burst in range(0, n, 100):
        t0 = perf()
        for i in range(start + burst, start + min(n, burst + 100)):
            tracker.track(
                "Order Completed",
                user_id=f"user-{i % 5000}",
                properties={"order_id": f"o-{i}", **props},
            )
        spent += perf() - t0
        due = t_start + (burst + 100) / rate
        delay = due - perf()
        if delay > 0:
            time.sleep(delay)
    return spent


def run_a(key: str, base_url: str, args: argparse.Namespace, inflight: int) -> float:
    errors: list[str] = []
    tracker = Tracker(
        key,
        base_url=base_url,
        max_batch=args.max_batch,
        max_queue_size=args.warmup + args.events + 1,
        max_inflight=inflight,
        on_error=lambda e, items: errors.append(f"{len(items)}: {e}"),
    )
    track_loop(tracker, args.warmup, 0)
    tracker.flush()
    before = tracker.stats()
    t0 = time.perf_counter()
    in_track = track_loop(tracker, args.events, args.warmup + inflight * 10_000_000)
    tracker.flush()
    elapsed = time.perf_counter() - t0
    after = tracker.stats()
    tracker.close()
    if errors or after.failed:
        raise SystemExit(f"events not delivered: {errors[:3]}")
    sent = after.accepted - before.accepted
    assert sent == args.events, (sent, args.events)
    reqs = after.requests - before.requests
    a = args.events / elapsed
    print(
        f"(a) one Tracker, max_inflight={inflight}: {args.events:,} events in {elapsed:.2f} s = {a:,.0f} events/s "
        f"accepted ({reqs} requests, {args.events / reqs:.0f} events/request, {after.retries - before.retries} retries)"
    )
    print(
        f"    track() meanwhile (worker saturated): {in_track / args.events * 1e6:.2f} µs per call"
    )
    return a


def main() -> None:
    args = parse_args()
    binary = args.bin
    if not os.access(binary, os.X_OK):
        raise SystemExit(
            f"no fastack binary at {binary} (cargo build --release, or --bin)"
        )
    run = "sdkpy" + uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix="fastack-sdk-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTACK_")}
    env.update(
        {
            "FASTACK_DATA_DIR": str(tmp / "data"),
            "FASTACK_LISTEN": "127.0.0.1:0",
            "FASTACK_LOG": "warn,fastack_api::server=info",
            "FASTACK_BOOTSTRAP": "false",
        }
    )
    backend = "sqlite"
    db_admin_url = db_name = None
    if args.postgres:
        backend = "postgres"
        db_name = f"fastack_{run}"
        db_admin_url = args.postgres
        psql(db_admin_url, f"CREATE DATABASE {db_name}")
        parts = urlsplit(args.postgres)
        env["FASTACK_DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{db_name}"))
        env["FASTACK_REDIS_URL"] = args.redis
        env["FASTACK_REDIS_PREFIX"] = run
        env["FASTACK_ENC_KEY"] = base64.b64encode(os.urandom(32)).decode()
    server = Server(binary, env)
    try:
        server.start(tmp / "serve.log")
        server.admin("tenant", "create", "--name", "bench", "--plan", "enterprise")
        key = server.admin("key", "create", "--tenant", "bench")["secret"]
        base_url = f"http://{server.addr}"
        print(
            f"server: {binary} ({backend}) at {base_url}; Python {sys.version.split()[0]}"
        )

        # (a) throughput of one Tracker, for each max_inflight.
        results: dict[int, float] = {}
        for inflight in [int(x) for x in args.max_inflight.split(",")]:
            results[inflight] = run_a(key, base_url, args, inflight)

        # (b) cost of track() at an application-like rate, the worker running.
        rate = args.rate or round(results[min(results)] / 2, -2)
        tracker = Tracker(key, base_url=base_url)
        spent = track_loop(tracker, args.calls, 100_000_000, rate=rate)
        ok = tracker.flush(timeout=120)
        st = tracker.stats()
        tracker.close()
        print(
            f"(b) track() at {rate:,.0f} events/s offered: {spent / args.calls * 1e6:.2f} µs per call "
            f"({args.calls:,} calls; delivered: {ok and st.accepted == args.calls}, dropped {st.dropped})"
        )
    finally:
        server.stop()
        if db_name and db_admin_url:
            psql(db_admin_url, f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")
        shutil.rmtree(tmp, ignore_errors=True)

    cmd = [
        str(Path(binary).with_name("fastack-bench")),
        "--server",
        binary,
        "--profile",
        "batch",
        "--connections",
        "8",
        "--no-baseline",
        "--backend",
        backend,
    ]
    if args.postgres:
        cmd += ["--postgres", args.postgres, "--redis", args.redis]
    print("\nfor comparison (same backend, same binary):\n  " + " ".join(cmd))
    if args.compare:
        cmd += ["--duration", str(args.duration), "--json"]
        out = subprocess.run(  # the return code is checked below
            cmd,
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("FASTACK_")},
        )
        if out.returncode != 0:
            raise SystemExit(out.stderr[-3000:])
        report = json.loads(out.stdout)
        runs = report if isinstance(report, list) else report.get("runs", [report])
        eps = max(float(r.get("events_per_sec", 0)) for r in _walk(runs))
        print(f"fastack-bench --profile batch: {eps:,.0f} events/s")
        for inflight, value in results.items():
            print(
                f"  Tracker max_inflight={inflight}: {value:,.0f} events/s = {value / eps:.0%} of it"
            )


def _walk(value: object):  # every dict with events_per_sec in the report
    if isinstance(value, dict):
        if "events_per_sec" in value:
            yield value
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


if __name__ == "__main__":
    threading.excepthook = lambda a: print(
        f"thread error: {a.exc_value!r}", file=sys.stderr
    )
    main()
