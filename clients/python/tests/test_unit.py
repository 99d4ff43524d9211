"""Behaviour that needs no server: retries, limits, parsing (httpx.MockTransport)."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from typing import Any, Callable

import httpx
import pytest

from fastack import ApiError, Client, Tracker, TransportError
from fastack._errors import parse_retry_after
from fastack._time import format_time, parse_time
from fastack._tracker import MAX_REQUEST_BYTES

from .conftest import python_env, sent_body

PROBLEM_422 = {
    "type": "urn:fastack:problem:invalid_payload",
    "title": "Unprocessable Entity",
    "status": 422,
    "detail": "one of `user_id` or `anonymous_id` is required",
    "code": "invalid_payload",
    "errors": [{"field": "/batch/1/user_id", "index": 1, "code": "required", "message": "required"}],
}


def problem(status: int, code: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": f"urn:fastack:problem:{code}",
        "title": "x",
        "status": status,
        "detail": code,
        "code": code,
        **extra,
    }


def ack_batch(request: httpx.Request) -> httpx.Response:
    n = len(json.loads(sent_body(request))["batch"])
    return httpx.Response(
        202, json={"items": [{"id": "01a22f86-4066-7748-b15e-ded1aa00ecc9", "duplicate": False}] * n}
    )


class Recorder:
    def __init__(self, answers: list[Callable[[httpx.Request], httpx.Response]]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
            self.times.append(time.monotonic())
            answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        return answer(request)


def mock_client(rec: Recorder, **kw: Any) -> Client:
    return Client("fsk_test", base_url="http://fastack.test", transport=httpx.MockTransport(rec), **kw)


def test_api_error_from_problem_and_from_anything() -> None:
    e = ApiError.from_response(
        422, {"content-type": "application/problem+json"}, json.dumps(PROBLEM_422).encode()
    )
    assert (e.status, e.code) == (422, "invalid_payload")
    assert (
        e.errors[0].field == "/batch/1/user_id"
        and e.errors[0].index == 1
        and e.errors[0]["code"] == "required"
    )
    assert "/batch/1/user_id" in str(e) and not e.retryable
    html = ApiError.from_response(502, {"retry-after": "3"}, b"<html>bad gateway</html>")
    assert (html.status, html.code, html.retry_after) == (502, "unexpected_response", 3.0)
    assert html.retryable and "bad gateway" in html.detail
    assert (
        parse_retry_after("1") == 1.0 and parse_retry_after("-5") == 0.0 and parse_retry_after("soon") is None
    )
    assert 0 <= (parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") or 0) == 0.0


def test_time_formats() -> None:
    assert parse_time("2026-11-30T09:15:00Z") == dt.datetime(2026, 11, 30, 9, 15, tzinfo=dt.timezone.utc)
    p = parse_time("2026-11-30T09:15:00.123456789+01:00")
    assert p.microsecond == 123456 and p.utcoffset() == dt.timedelta(hours=1)
    assert parse_time("2016-12-31T23:59:60.5Z").second == 59
    with pytest.raises(ValueError):
        parse_time("2026-11-30T09:15:00")  # no offset
    naive = dt.datetime(2026, 11, 30, 9, 15)
    assert format_time(naive).startswith("2026-11-30T09:15:00") and parse_time(format_time(naive)).tzinfo
    assert format_time("as-is") == "as-is"


def test_client_retries_429_honouring_retry_after_then_succeeds() -> None:
    rec = Recorder(
        [
            lambda r: httpx.Response(429, headers={"retry-after": "1"}, json=problem(429, "rate_limited")),
            lambda r: httpx.Response(503, json=problem(503, "unavailable")),
            lambda r: httpx.Response(
                202, json={"id": "01a22f86-4066-7748-b15e-ded1aa00ecc9", "duplicate": True}
            ),
        ]
    )
    with mock_client(rec) as client:
        ack = client.track("x", user_id="u", idempotency_key="k")
    assert ack.duplicate is True and len(rec.requests) == 3
    assert rec.times[1] - rec.times[0] >= 1.0
    # The same request (same key, same body) every time.
    assert len({r.content for r in rec.requests}) == 1
    assert rec.requests[0].headers["authorization"] == "Bearer fsk_test"


def test_client_gives_up_and_does_not_repeat_what_is_unsafe() -> None:
    rec = Recorder([lambda r: httpx.Response(500, json=problem(500, "internal"))])
    with mock_client(rec, max_retries=2) as client:
        with pytest.raises(ApiError) as info:
            client.track("x", user_id="u")
        assert info.value.code == "internal" and len(rec.requests) == 3
        rec.requests.clear()
        with pytest.raises(ApiError):
            client.create_export("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z")
        assert len(rec.requests) == 1  # an export is not repeated after a 500

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("connection reset", request=request)

    rec = Recorder([reset])
    with mock_client(rec, max_retries=1) as client:
        with pytest.raises(TransportError):
            client.create_export("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z")
        assert len(rec.requests) == 1
        with pytest.raises(TransportError):
            client.get_job("01a22f86-4066-7748-b15e-ded1aa00ecc9")
        assert len(rec.requests) == 3


def test_wait_times_out_on_a_job_that_does_not_finish() -> None:
    job = {
        "job_id": "01a22f86-599a-74ec-bf9d-f606fbe90ae8",
        "kind": "export",
        "status": "queued",
        "metadata": {},
        "created_at": "2026-12-01T10:00:00Z",
    }
    rec = Recorder([lambda r: httpx.Response(200, json=job)])
    with mock_client(rec) as client:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="still queued"):
            client.wait(job["job_id"], timeout=0.3, poll_interval=0.05)
        assert 0.3 <= time.monotonic() - started < 2
        assert len(rec.requests) >= 3


def mock_tracker(rec: Recorder, **kw: Any) -> Tracker:
    return Tracker("fsk_test", base_url="http://fastack.test", transport=httpx.MockTransport(rec), **kw)


def test_tracker_resends_the_same_bytes_after_429_and_5xx() -> None:
    rec = Recorder(
        [
            lambda r: httpx.Response(429, headers={"retry-after": "1"}, json=problem(429, "rate_limited")),
            lambda r: httpx.Response(500, json=problem(500, "internal")),
            lambda r: httpx.Response(502, text="bad gateway"),
            ack_batch,
        ]
    )
    errors: list[Any] = []
    t = mock_tracker(rec, flush_interval=60, on_error=lambda e, items: errors.append(e))
    for i in range(10):
        t.track("x", user_id="u", properties={"i": i})
    assert t.close()
    assert errors == [] and len(rec.requests) == 4
    assert len({r.content for r in rec.requests}) == 1
    assert rec.times[1] - rec.times[0] >= 1.0  # Retry-After honoured
    st = t.stats()
    assert (st.accepted, st.retries, st.requests) == (10, 3, 4)
    body = json.loads(sent_body(rec.requests[0]))
    assert len(body["batch"]) == 10 and body["batch"][0]["type"] == "track"
    assert rec.requests[0].headers["content-type"] == "application/json"


def test_tracker_sends_as_is_after_a_415_to_a_compressed_batch() -> None:
    """A server before compressed bodies answers 415: the same batch goes
    again as is, and so does every later one; nothing reaches on_error."""
    rec = Recorder([lambda r: httpx.Response(415, json=problem(415, "unsupported_media_type")), ack_batch])
    errors: list[Any] = []
    t = mock_tracker(rec, flush_interval=60, max_batch=20, on_error=lambda e, items: errors.append(e))
    for i in range(40):
        t.track("x", user_id="u", properties={"i": i, "pad": "z" * 60})
    assert t.close()
    assert errors == [] and len(rec.requests) == 3
    encodings = [r.headers.get("content-encoding") for r in rec.requests]
    assert encodings == ["gzip", None, None]
    assert sent_body(rec.requests[0]) == rec.requests[1].content
    assert t.stats().accepted == 40
    with pytest.raises(ValueError):
        Tracker("fsk_test", compression="br")


def test_tracker_does_not_retry_other_4xx() -> None:
    rec = Recorder([lambda r: httpx.Response(401, json=problem(401, "unauthorized"))])
    got: list[tuple[Any, list[Any]]] = []
    t = mock_tracker(rec, flush_interval=60, on_error=lambda e, items: got.append((e, items)))
    for i in range(3):
        t.track("x", user_id="u", properties={"i": i})
    t.close()
    assert len(rec.requests) == 1
    assert len(got) == 1 and got[0][0].code == "unauthorized" and len(got[0][1]) == 3


def test_tracker_a_403_stops_sending_and_is_raised_when_asked() -> None:
    from fastack import Forbidden, TrackerError

    rec = Recorder([lambda r: httpx.Response(403, json=problem(403, "forbidden"))])
    got: list[tuple[Any, list[Any]]] = []
    t = mock_tracker(rec, flush_interval=60, max_batch=2, max_inflight=1, on_error=lambda e, items: got.append((e, items)))
    for i in range(5):
        t.track("x", user_id="u", properties={"i": i})
    result = t.flush()
    assert not result and result.failed == 5 and isinstance(result.error, Forbidden)
    # One request: the rest of the queue failed with the same error, unsent.
    assert len(rec.requests) == 1
    assert [(e.kind, len(items)) for e, items in got] == [("forbidden", 2), ("forbidden", 3)]
    assert isinstance(ApiError.from_response(403, {}, b""), Forbidden)
    with pytest.raises(TrackerError) as caught:
        t.close(raise_on_error=True)
    assert (caught.value.kind, caught.value.status, caught.value.result.failed) == ("forbidden", 403, 0)


def test_tracker_isolates_named_items_and_resends_the_rest() -> None:
    rec = Recorder([lambda r: httpx.Response(422, json=PROBLEM_422), ack_batch])
    got: list[tuple[Any, list[Any]]] = []
    t = mock_tracker(rec, flush_interval=60, on_error=lambda e, items: got.append((e, items)))
    keys = [t.track("x", user_id="u", properties={"i": i}) for i in range(3)]
    t.close()
    assert len(rec.requests) == 2
    assert [it["idempotency_key"] for it in got[0][1]] == [keys[1]]
    resent = json.loads(sent_body(rec.requests[1]))["batch"]
    assert [it["idempotency_key"] for it in resent] == [keys[0], keys[2]]
    assert (
        sent_body(rec.requests[1])
        == b'{"batch":['
        + b",".join(
            json.dumps(
                json.loads(sent_body(rec.requests[0]))["batch"][i], ensure_ascii=False, separators=(",", ":")
            ).encode()
            for i in (0, 2)
        )
        + b"]}"
    )


def test_tracker_halves_a_batch_the_server_finds_too_large() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if len(json.loads(sent_body(request))["batch"]) > 2:
            return httpx.Response(413, json=problem(413, "payload_too_large"))
        return ack_batch(request)

    rec = Recorder([answer])
    t = mock_tracker(rec, flush_interval=60)
    for i in range(8):
        t.track("x", user_id="u", properties={"i": i})
    t.close()
    assert t.stats().accepted == 8 and t.stats().failed == 0


def test_tracker_batches_stay_within_limits() -> None:
    rec = Recorder([ack_batch])
    t = mock_tracker(rec, flush_interval=60, max_batch=500)
    pad = "p" * 30_000
    for i in range(300):  # 300 × ~30 KB = ~9 MB: at least three requests
        t.track("big", user_id="u", properties={"i": i, "pad": pad})
    for i in range(1200):
        t.track("small", user_id="u", properties={"i": i})
    assert t.close()
    sizes = [len(sent_body(r)) for r in rec.requests]
    counts = [len(json.loads(sent_body(r))["batch"]) for r in rec.requests]
    assert max(sizes) <= MAX_REQUEST_BYTES and max(counts) <= 500
    assert sum(counts) == 1500 and t.stats().accepted == 1500
    assert max(sizes) > MAX_REQUEST_BYTES - 40_000  # batches are filled up to the limit
    seen = [
        it["properties"]["i"]
        for r in rec.requests
        for it in json.loads(sent_body(r))["batch"]
        if it["event"] == "big"
    ]
    assert seen == list(range(300))  # in order


def test_tracker_track_is_cheap_and_never_blocks() -> None:
    block = threading.Event()

    def slow(request: httpx.Request) -> httpx.Response:
        block.wait(10)
        return ack_batch(request)

    rec = Recorder([slow])
    t = mock_tracker(rec, flush_interval=0.01, max_batch=10)
    started = time.perf_counter()
    for i in range(2000):
        t.track("x", user_id="u", properties={"i": i})
    per_call = (time.perf_counter() - started) / 2000
    block.set()
    assert t.close(timeout=30)
    assert per_call < 200e-6  # generous bound for a loaded CI box; the benchmark measures it properly


def test_tracker_validates_its_configuration() -> None:
    for kw in ({"max_batch": 0}, {"max_batch": 501}, {"max_queue_size": 0}, {"flush_interval": 0}):
        with pytest.raises(ValueError):
            Tracker("fsk_x", **kw)  # type: ignore[arg-type]


def test_generated_timestamps_and_keys() -> None:
    """now() has the local offset, as datetime.now().astimezone() would;
    keys are UUIDv7, unique, time-ordered, and differ after a fork."""
    import subprocess
    import sys
    import uuid

    code = (
        "import datetime, fastack._fast as f; a = f.now(); b = datetime.datetime.now().astimezone().isoformat();"
        "print(a[19:], b[26:], datetime.datetime.fromisoformat(a).utcoffset() == datetime.datetime.fromisoformat(b).utcoffset())"
    )
    for tz, offset in (("UTC", "+00:00"), ("Asia/Kolkata", "+05:30"), ("America/St_Johns", None)):
        out = subprocess.run(
            [sys.executable, "-c", code], env=python_env(TZ=tz), capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        frac_and_off, ref_off, same = out.stdout.split()
        assert same == "True" and frac_and_off.endswith(ref_off)
        assert len(frac_and_off) == len(".123456+00:00")
        if offset:
            assert ref_off == offset

    from fastack._fast import new_key

    keys = [new_key() for _ in range(5000)]
    assert len(set(keys)) == 5000
    assert all(uuid.UUID(k).version == 7 for k in keys[:50])
    assert keys[0][:13] <= keys[-1][:13]  # the millisecond prefix does not go back
    if hasattr(__import__("os"), "fork"):
        import os

        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: its keys must not repeat the parent's pool
            os.write(w, new_key().encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child_key = os.read(r, 100).decode()
        assert child_key[14:] != new_key()[14:]
