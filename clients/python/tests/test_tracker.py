"""Tracker against a real server: exactly-once under 429s and a SIGKILL,
close() flushing, items the server can never take, drops."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from typing import Any

import httpx

from fastack import ApiError, Client, EventTooLarge, FastackError, QueueFull, Tracker, TrackerClosed
from fastack._fast import dumps as _encode
from fastack._tracker import MAX_EVENT_BYTES

from .conftest import Server, free_port, python_env, recent, sent_body, wait_for, window

# Timestamps the tests send where the value itself matters (an exact size,
# the same content twice): fixed for the run, relative to today.
AN_HOUR_AGO = recent(1)
A_DAY_AGO = recent(24)


class Errors:
    """An on_error that remembers what it got (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[FastackError, list[dict[str, Any]]]] = []

    def __call__(self, error: FastackError, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.calls.append((error, items))

    def items(self, kind: type = FastackError) -> list[dict[str, Any]]:
        with self.lock:
            return [it for err, items in self.calls if isinstance(err, kind) for it in items]


def read_seq(client: Client, event: str) -> Counter[int]:
    frm, to = window()
    return Counter(int(e.properties["seq"]) for e in client.events(frm, to, event=event))


def assert_exactly_once(server: Server, key: str, event: str, n: int, timeout: float = 60) -> None:
    """Through the API: n events named `event`, distinct ids, seq 0..n-1 once each."""
    with Client(key, base_url=server.base_url) as client:
        wait_for(
            lambda: sum(read_seq(client, event).values()) >= n, timeout=timeout, what=f"{n} {event} events"
        )
        time.sleep(0.5)  # anything doubled would show up by now
        frm, to = window()
        events = list(client.events(frm, to, event=event))
        ids = [str(e.id) for e in events]
        assert len(ids) == n, f"{len(ids)} events for {n} tracked"
        assert len(set(ids)) == n, "an event id appears twice"
        seq = Counter(int(e.properties["seq"]) for e in events)
        assert sorted(seq) == list(range(n)) and set(seq.values()) == {1}, "an item is missing or doubled"


def test_close_flushes_everything(server: Server, api_key: str) -> None:
    errors = Errors()
    # A long interval: only close() can have sent the partial batch.
    tracker = Tracker(api_key, base_url=server.base_url, flush_interval=60, on_error=errors)
    keys = [tracker.track("Closing", user_id=f"u-{i % 3}", properties={"seq": i}) for i in range(120)]
    tracker.identify(user_id="u-0", anonymous_id="a-0", traits={"plan": "pro"}, idempotency_key="ident-u0")
    assert len(set(keys)) == 120
    assert tracker.stats().queued == 121
    assert tracker.close()
    st = tracker.stats()
    assert (st.queued, st.in_flight, st.accepted, st.failed, st.dropped) == (0, 0, 121, 0, 0)
    assert st.requests == 1
    assert errors.calls == []
    assert tracker.close()  # idempotent
    assert_exactly_once(server, api_key, "Closing", 120)
    with Client(api_key, base_url=server.base_url) as client:
        assert wait_for(lambda: client.find_contact(anonymous_id="a-0").traits.to_dict() == {"plan": "pro"})

    # After close: nothing is sent, the item is reported.
    tracker.track("Late", user_id="u")
    assert isinstance(errors.calls[-1][0], TrackerClosed)


def test_flush_interval_and_flush(server: Server, api_key: str) -> None:
    tracker = Tracker(api_key, base_url=server.base_url, flush_interval=0.2)
    try:
        tracker.track("Tick", user_id="u", properties={"seq": 0})
        # Sent by the timer, without flush().
        wait_for(lambda: tracker.stats().accepted == 1, timeout=10, what="timer flush")
        for i in range(1, 1201):  # more than two full batches
            tracker.track("Tick", user_id="u", properties={"seq": i})
        assert tracker.flush(timeout=60)
        st = tracker.stats()
        assert st.accepted == 1201 and st.queued == 0 and st.in_flight == 0
        assert st.requests >= 3
    finally:
        tracker.close()
    assert_exactly_once(server, api_key, "Tick", 1201)


def test_rate_limited_key_delivers_exactly_once(server: Server) -> None:
    key = server.admin("key", "create", "--tenant", "default", "--rate-limit", "2")["secret"]
    errors = Errors()
    n = 200
    tracker = Tracker(key, base_url=server.base_url, flush_interval=0.05, max_batch=20, on_error=errors)
    for i in range(n):
        tracker.track("Limited", user_id=f"u-{i % 10}", properties={"seq": i})
        if i % 50 == 0:
            time.sleep(0.01)
    assert tracker.flush(timeout=120)
    st = tracker.stats()
    tracker.close()
    assert errors.calls == []
    assert st.accepted == n
    assert st.retries > 0, "the key's 2 requests/s should have answered 429 at least once"
    assert_exactly_once(server, key, "Limited", n)


def test_sigkill_mid_flush_and_restart_delivers_exactly_once(server_factory: Any) -> None:
    port = free_port()
    # The restarted process is a new node: it takes the tenant's processing
    # over when the dead one's lease expires (10 s by default; 2 s here).
    server: Server = server_factory(port=port, env={"FASTACK_LEASE_TTL_MS": "2000"})
    key = server.bootstrap_key
    errors = Errors()
    n = 3000
    tracker = Tracker(key, base_url=server.base_url, flush_interval=0.05, max_batch=50, on_error=errors)

    def produce() -> None:
        for i in range(n):
            tracker.track("Survivor", user_id=f"u-{i % 20}", properties={"seq": i})
            if i % 100 == 99:
                time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    # Kill while batches are in flight (some accepted, some answered, some not).
    t0 = time.monotonic()
    wait_for(
        lambda: (st := tracker.stats()).accepted >= 400 and st.in_flight > 0,
        timeout=30,
        interval=0.001,
        what="a batch in flight after some were accepted",
    )
    assert tracker.stats().accepted < n
    server.kill()
    accepted_at_kill = tracker.stats().accepted
    time.sleep(1.0)  # the tracker retries against a closed port meanwhile
    server.start()
    assert server.port == port
    producer.join()
    assert tracker.flush(timeout=120)
    t1 = time.monotonic()
    st = tracker.stats()
    tracker.close()
    print(f"kill test: {accepted_at_kill} accepted at the kill, all in {t1 - t0:.1f} s: {st}")
    assert errors.calls == [], errors.calls[:1]
    assert st.accepted == n and st.retries > 0
    assert accepted_at_kill < n
    assert_exactly_once(server, key, "Survivor", n)


class LosingProxy:
    """An HTTP proxy in front of the server that forwards the first `lose`
    batch requests and then hangs up instead of answering: the server has
    accepted them, the tracker never hears so."""

    def __init__(self, upstream: str, lose: int) -> None:
        import http.client
        import http.server
        from urllib.parse import urlsplit

        host = urlsplit(upstream)
        self.lost = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
                conn.request("POST", self.path, body=body, headers=dict(self.headers))
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if proxy.lost < lose and self.path == "/v1/core/batch" and resp.status == 202:
                    proxy.lost += 1
                    self.close_connection = True
                    self.connection.shutdown(2)  # the answer is lost
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_lost_answers_are_resent_and_answered_as_duplicates(server: Server, api_key: str) -> None:
    proxy = LosingProxy(server.base_url, lose=3)
    errors = Errors()
    tracker = Tracker(api_key, base_url=proxy.url, flush_interval=0.05, max_batch=100, on_error=errors)
    try:
        for i in range(500):
            tracker.track("Lost", user_id=f"u-{i % 5}", properties={"seq": i})
        assert tracker.flush(timeout=60)
        st = tracker.stats()
    finally:
        tracker.close()
        proxy.close()
    print("lost test:", st)
    assert proxy.lost == 3 and errors.calls == []
    # The 3 batches whose answers were lost were re-sent with the same keys
    # and answered with their original ids.
    assert st.accepted == 500 and st.retries >= 3 and st.duplicates >= 1
    assert_exactly_once(server, api_key, "Lost", 500)


def test_items_the_server_can_never_take_go_to_on_error(server: Server, api_key: str) -> None:
    errors = Errors()
    tracker = Tracker(api_key, base_url=server.base_url, flush_interval=60, on_error=errors)
    with Client(api_key, base_url=server.base_url) as client:
        client.track("Taken", user_id="u", occurred_at=A_DAY_AGO, idempotency_key="taken")

    # Exactly at the limit: accepted; one byte over: reported, never sent.
    pad = "x" * (MAX_EVENT_BYTES - 200)
    base = {
        "type": "track",
        "event": "Mixed",
        "user_id": "u",
        "properties": {"seq": 1, "pad": pad},
        "occurred_at": AN_HOUR_AGO,
        "idempotency_key": "edge-1",
    }
    base["properties"]["pad"] = pad + "x" * (MAX_EVENT_BYTES - len(_encode(base).encode()))
    assert len(_encode(base).encode()) == MAX_EVENT_BYTES
    tracker.track("Mixed", user_id="u", properties={"seq": 0})
    tracker.track(
        "Mixed",
        user_id="u",
        properties=base["properties"],
        occurred_at=base["occurred_at"],
        idempotency_key="edge-1",
    )
    tracker.track("Mixed", user_id="u", properties={"seq": 99, "pad": "é" * MAX_EVENT_BYTES})
    # Refused by the server inside a batch (422 / 409 naming the item): only
    # those items are reported; the rest of the batch is sent again.
    tracker.track("Mixed", user_id="u", properties={"seq": 98}, occurred_at="not a time")
    tracker.track("Other", user_id="u", occurred_at=A_DAY_AGO, idempotency_key="taken")
    tracker.track("Mixed", user_id="u", properties={"seq": 2})
    tracker.track("Mixed", user_id="u", properties={"seq": 97, "big": 123456789012345678901234567890})
    tracker.track("Mixed", user_id="u", properties={"seq": 3})
    # Everything was delivered or reported, but not everything was delivered:
    # the result says so (1 too large, 3 refused).
    result = tracker.close()
    assert not result and result.failed == 4 and result.pending == 0 and result.spooled == 0
    assert isinstance(result.error, (ApiError, EventTooLarge))

    # A repeated member name ({1: .., "1": ..} encodes as {"1":..,"1":..}) is a
    # 400 invalid_json that does not say which item: found by halves.
    tracker = Tracker(api_key, base_url=server.base_url, flush_interval=60, on_error=errors)
    tracker.track("Mixed", user_id="u", properties={"seq": 4})
    tracker.track("Mixed", user_id="u", properties={"seq": 96, 1: "a", "1": "b"})
    for seq in range(5, 9):
        tracker.track("Mixed", user_id="u", properties={"seq": seq})
    result = tracker.close()
    assert not result and result.failed == 1 and result.error.kind == "rejected"  # type: ignore[union-attr]
    assert tracker.stats().accepted == 5

    too_large = errors.items(EventTooLarge)
    assert [it["properties"]["seq"] for it in too_large] == [99]
    refused = [(err, items) for err, items in errors.calls if isinstance(err, ApiError)]
    codes = sorted(err.code for err, _ in refused)
    assert codes == ["idempotency_key_conflict", "invalid_json", "invalid_payload"], refused
    bad_seq = sorted(it.get("properties", {}).get("seq", -1) for _, items in refused for it in items)
    assert bad_seq == [-1, 96, 97, 98]
    assert_exactly_once(server, api_key, "Mixed", 9)


def test_full_queue_drops_without_blocking() -> None:
    errors = Errors()
    # Nobody listens: every send fails and is retried, so the queue fills.
    tracker = Tracker(
        "fsk_x",
        base_url=f"http://127.0.0.1:{free_port()}",
        flush_interval=60,
        max_queue_size=10,
        on_error=errors,
    )
    started = time.monotonic()
    for i in range(25):
        tracker.track("Dropped", user_id="u", properties={"seq": i})
    assert time.monotonic() - started < 0.5
    assert tracker.dropped == 15 and tracker.stats().dropped == 15
    dropped = errors.items(QueueFull)
    assert [it["properties"]["seq"] for it in dropped] == list(range(10, 25))
    assert isinstance(errors.calls[-1][0], QueueFull) and errors.calls[-1][0].dropped == 15
    # close() with a timeout gives up and reports what was not delivered.
    result = tracker.close(timeout=0.5)
    assert not result and result.timed_out and result.failed == 25 and result.spooled == 0
    undelivered = errors.items(TrackerClosed)
    assert sorted(it["properties"]["seq"] for it in undelivered) == list(range(10))
    assert tracker.stats().failed == 25


def test_exit_handler_flushes(server: Server, api_key: str, tmp_path: Any) -> None:
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from fastack import Tracker
            t = Tracker({api_key!r}, base_url={server.base_url!r}, flush_interval=3600)
            for i in range(50):
                t.track("AtExit", user_id="u", properties={{"seq": i}})
            # no flush, no close: the interpreter's exit must send them
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)], env=python_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert_exactly_once(server, api_key, "AtExit", 50)


def test_arguments_that_can_never_be_sent_raise() -> None:
    tracker = Tracker("fsk_x", base_url=f"http://127.0.0.1:{free_port()}", flush_interval=60)
    try:
        import pytest

        with pytest.raises(ValueError):
            tracker.track("x")  # neither user_id nor anonymous_id
        with pytest.raises(ValueError):
            tracker.track("", user_id="u")
        with pytest.raises(ValueError):
            tracker.identify(user_id="u", idempotency_key="k" * 256)
        with pytest.raises(TypeError):
            tracker.track("x", user_id="u", properties={"when": object()})
        with pytest.raises(ValueError):
            tracker.track("x", user_id="u", properties={"nan": float("nan")})
        key = tracker.track("x", user_id="u", idempotency_key="mine")
        assert key == "mine"
        assert tracker.stats().queued == 1
    finally:
        tracker.close(timeout=0.1)


def test_batches_fill_requests_up_to_exactly_4_mib(server: Server, api_key: str) -> None:
    """127 items of exactly 32 KiB and one of 32,629 bytes make a request of
    exactly 4 MiB (with the envelope and commas): the server takes it."""
    from fastack._tracker import MAX_REQUEST_BYTES

    def props_for(seq: int, size: int) -> dict[str, Any]:
        item = {
            "type": "track",
            "event": "Big",
            "user_id": "u",
            "properties": {"seq": seq, "pad": ""},
            "occurred_at": AN_HOUR_AGO,
            "idempotency_key": f"big-{seq:04d}",
        }
        item["properties"]["pad"] = "x" * (size - len(_encode(item).encode()))
        assert len(_encode(item).encode()) == size
        return item["properties"]

    sizes = [MAX_EVENT_BYTES] * 127 + [MAX_REQUEST_BYTES - (127 * MAX_EVENT_BYTES + 127 + 12)]
    sizes += [MAX_EVENT_BYTES] * 3  # the next request
    assert 12 + sum(sizes[:128]) + 127 == MAX_REQUEST_BYTES
    errors = Errors()
    tracker = Tracker(api_key, base_url=server.base_url, flush_interval=60, on_error=errors)
    for seq, size in enumerate(sizes):
        tracker.track(
            "Big",
            user_id="u",
            properties=props_for(seq, size),
            occurred_at=AN_HOUR_AGO,
            idempotency_key=f"big-{seq:04d}",
        )
    assert tracker.close()
    st = tracker.stats()
    assert errors.calls == [] and st.accepted == len(sizes) and st.requests == 2
    assert_exactly_once(server, api_key, "Big", len(sizes))


class RecordingTransport(httpx.HTTPTransport):
    """The real transport, remembering each request's content-encoding."""

    def __init__(self) -> None:
        super().__init__()
        self.encodings: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.encodings.append(request.headers.get("content-encoding"))
        return super().handle_request(request)


def test_compressed_batches_are_stored_exactly_as_tracked(server: Server, api_key: str) -> None:
    """Batches of 1 KiB or more go gzip-compressed; the server stores each
    event exactly as tracked, and far fewer bytes cross the wire."""
    transport = RecordingTransport()
    errors = Errors()
    tracker = Tracker(api_key, base_url=server.base_url, flush_interval=60, on_error=errors, transport=transport)
    sent = {}
    for seq in range(400):
        props = {
            "seq": seq,
            "text": f'café ☕ 𝄞 "quoted" \\ line\nbreak {seq}',
            "nested": {"a": [1, {"b": None}, True]},
            "big": 2**63 - 1,
        }
        sent[seq] = props
        tracker.track("Squeezed", user_id=f"u-{seq % 5}", properties=props, occurred_at=AN_HOUR_AGO)
    assert tracker.close()
    st = tracker.stats()
    assert errors.calls == [] and st.accepted == 400
    assert transport.encodings and set(transport.encodings) == {"gzip"}, transport.encodings
    raw = sum(len(_encode(p).encode()) for p in sent.values())
    assert st.bytes_sent * 4 < raw, f"{st.bytes_sent} bytes sent for {raw} bytes of properties"
    assert_exactly_once(server, api_key, "Squeezed", 400)
    with Client(api_key, base_url=server.base_url) as client:
        frm, to = window()
        for e in client.events(frm, to, event="Squeezed"):
            assert e.properties.to_dict() == sent[int(e.properties["seq"])]


def test_small_batches_and_compression_none_go_as_is(server: Server, api_key: str) -> None:
    transport = RecordingTransport()
    small = Tracker(api_key, base_url=server.base_url, flush_interval=60, transport=transport)
    small.track("Tiny", user_id="u")
    assert small.close()
    transport2 = RecordingTransport()
    plain = Tracker(api_key, base_url=server.base_url, flush_interval=60, transport=transport2, compression=None)
    for seq in range(50):
        plain.track("Plain", user_id="u", properties={"seq": seq, "pad": "p" * 100})
    assert plain.close()
    assert plain.stats().accepted == 50
    assert transport.encodings == [None] and transport2.encodings == [None]


def test_identity_changes_keep_their_order_while_tracks_overlap() -> None:
    """With several batches in flight, a batch holding an identify (or a
    track that links ids) is sent alone: everything tracked before it is
    accepted first, nothing tracked after it is sent until it is; batches of
    plain tracks overlap."""
    import json as _json

    import httpx

    lock = threading.Lock()
    in_flight = [0]
    log: list[tuple[float, float, list[int], bool, int]] = []  # start, end, numbers, ordered, overlap

    def number(it: dict[str, Any]) -> int:
        return int((it.get("properties") or it.get("traits"))["n"])

    def handler(request: httpx.Request) -> httpx.Response:
        items = _json.loads(sent_body(request))["batch"]
        with lock:
            in_flight[0] += 1
            overlap = in_flight[0]
            start = time.monotonic()
        time.sleep(0.02)
        ordered = any(it["type"] == "identify" or ("user_id" in it and "anonymous_id" in it) for it in items)
        with lock:
            in_flight[0] -= 1
            log.append((start, time.monotonic(), [number(it) for it in items], ordered, overlap))
        body = {"items": [{"duplicate": False, "id": str(i)} for i in range(len(items))]}
        return httpx.Response(202, json=body)

    tracker = Tracker(
        "fsk_x", max_batch=10, max_inflight=3, flush_interval=60, transport=httpx.MockTransport(handler)
    )
    n = 0
    for _ in range(20):
        for _ in range(95):
            tracker.track("Plain", user_id="u", properties={"n": n})
            n += 1
        tracker.identify(user_id="u", anonymous_id="a", traits={"n": n})
        tracker.track("Linked", user_id="u", anonymous_id="a", properties={"n": n + 1})
        n += 2
    assert tracker.flush(timeout=30)
    tracker.close()

    assert sorted(x for _, _, nums, _, _ in log for x in nums) == list(range(n)), "each item once"
    assert max(o for _, _, _, ordered, o in log if not ordered) >= 2, "plain tracks overlap"
    for start, end, nums, ordered, _ in log:
        if not ordered:
            continue
        for s2, e2, other, _, _ in log:
            if other is nums:
                continue
            assert e2 <= start or s2 >= end, "a batch that keeps identity order goes alone"
            if max(other) < min(nums):
                assert e2 <= start, "something tracked before it was still in flight"
            if min(other) > max(nums):
                assert s2 >= end, "something tracked after it was sent first"


def test_concurrency_climbs_where_it_pays_and_stays_low_where_it_does_not() -> None:
    """The in-flight limit, driven by a simulated server: one whose
    throughput grows up to 3 batches in flight (PostgreSQL-like) and one
    that only gets slower with a second (a single writer)."""
    from fastack._tracker import _Concurrency

    def settle(rate_at: Any, ceiling: int = 4, windows: int = 400) -> list[int]:
        c = _Concurrency(ceiling, now=0.0)
        now = 0.0
        seen = []
        for _ in range(windows * c.WINDOW_BATCHES):
            # A batch of 500 takes 500 / rate seconds at the current limit.
            now += 500 / rate_at(c.limit)
            c.finished(500, now)
            seen.append(c.limit)
        return seen

    pg = settle(lambda k: 10_000 * min(k, 3))
    assert max(pg) == 4, "it tries one more than pays"
    tail = pg[-2000:]
    assert tail.count(3) / len(tail) > 0.8, "and settles where throughput peaks"
    lite = settle(lambda k: 12_000 if k == 1 else 9_000)
    tail = lite[-2000:]
    assert tail.count(1) / len(tail) > 0.8, "a second batch in flight that hurts is given up"
    assert settle(lambda k: 10_000 * k, ceiling=1)[-1] == 1
