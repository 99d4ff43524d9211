"""Tracker shutdown against a real server: flush()/close() return by their
deadline and say what they did not deliver, a refused key is an error, and
the spool keeps undelivered events across a restart, exactly once."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from fastack import (
    Client,
    FlushResult,
    TrackerError,
    TransportError,
    Unauthorized,
    Undelivered,
)
from fastack._tracker import DEFAULT_CLOSE_TIMEOUT, DEFAULT_FLUSH_TIMEOUT, Tracker

from .conftest import Server, free_port, python_env, recent
from .test_tracker import AN_HOUR_AGO, Errors, LosingProxy, assert_exactly_once

# What a deadline may overrun by on a small, busy machine (thread wake-ups,
# the join grace for a request in flight).
SLACK = 1.5


def spool_files(spool: Path) -> list[str]:
    return sorted(p.name for p in spool.iterdir())


def spooled_items(spool: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(spool.glob("*.jsonl")) for line in p.read_bytes().splitlines()]


def test_the_default_deadlines_are_bounded() -> None:
    assert DEFAULT_FLUSH_TIMEOUT == 10.0 and DEFAULT_CLOSE_TIMEOUT == 10.0
    tracker = Tracker("fsk_x", base_url=f"http://127.0.0.1:{free_port()}")
    try:
        assert (tracker._flush_timeout, tracker._close_timeout) == (10.0, 10.0)
    finally:
        tracker.close(timeout=0)
    assert FlushResult() and not FlushResult(pending=1) and not FlushResult(spooled=1)


def test_close_against_a_dead_port_returns_by_its_deadline_and_says_what_it_did_not_deliver(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="fastack")
    port = free_port()  # nobody listens there
    errors = Errors()
    # Retried for ever by default (max_retries=None): only the deadlines end it.
    tracker = Tracker(
        "fsk_x",
        base_url=f"http://127.0.0.1:{port}",
        flush_interval=0.05,
        on_error=errors,
        flush_timeout=1.0,
        close_timeout=2.0,
    )
    keys = [tracker.track("Nowhere", user_id="u", properties={"seq": i}) for i in range(7)]

    started = time.monotonic()
    flushed = tracker.flush()  # the tracker's flush_timeout
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 1.0 + SLACK, elapsed
    assert not flushed and flushed.timed_out and flushed.pending == 7 and flushed.failed == 0
    assert isinstance(flushed.error, TransportError), flushed.error
    assert errors.calls == []  # flush() gives nothing up: still queued, retried
    assert "flush(): 7 item(s) not delivered (7 still queued)" in caplog.text

    started = time.monotonic()
    closed = tracker.close()  # the tracker's close_timeout
    elapsed = time.monotonic() - started
    assert elapsed < 2.0 + SLACK, elapsed
    assert not closed and closed.timed_out
    assert (closed.pending, closed.failed, closed.spooled, closed.undelivered) == (0, 7, 0, 7)
    assert isinstance(closed.error, Undelivered) and closed.error.kind == "undelivered"
    assert "ConnectError" in str(closed.error)  # the last error a retry saw
    # Without a spool, on_error got them (with their keys: a resend is safe).
    assert [type(e) for e, _ in errors.calls] == [Undelivered]
    assert sorted(it["idempotency_key"] for it in errors.items()) == sorted(keys)
    assert "close() after" in caplog.text and "7 item(s) not delivered (7 given to on_error)" in caplog.text
    assert tracker.close() is closed  # idempotent: the same answer

    # raise_on_error: the same, raised.
    other = Tracker("fsk_x", base_url=f"http://127.0.0.1:{port}", on_error=Errors())
    other.track("Nowhere", user_id="u")
    started = time.monotonic()
    with pytest.raises(TrackerError) as caught:
        other.close(timeout=0.5, raise_on_error=True)
    assert time.monotonic() - started < 0.5 + SLACK
    assert caught.value.kind == "undelivered" and caught.value.result.failed == 1
    assert caught.value.status is None


def test_a_refused_key_is_an_error_not_a_success(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fastack")
    errors = Errors()
    tracker = Tracker("fsk_wrong", base_url=server.base_url, flush_interval=60, on_error=errors)
    key = tracker.track("Refused", user_id="u")
    assert isinstance(key, str)  # track() still answers a key: nothing is sent yet
    tracker.track("Refused", user_id="u")
    tracker.identify(user_id="u", traits={"plan": "pro"})

    flushed = tracker.flush()
    assert not flushed and flushed.failed == 3 and flushed.pending == 0
    assert isinstance(flushed.error, Unauthorized) and flushed.error.status == 401
    assert flushed.error.kind == "unauthorized" and flushed.error.code == "unauthorized"
    assert [(e.kind, len(items)) for e, items in errors.calls] == [("unauthorized", 3)]
    assert any(r.levelno == logging.ERROR and "refused the API key" in r.getMessage() for r in caplog.records)

    # The tracker stopped sending: later items fail fast with the same error.
    tracker.track("Refused", user_id="u")
    assert [(e.kind, len(items)) for e, items in errors.calls] == [("unauthorized", 3), ("unauthorized", 1)]
    assert errors.calls[1][0] is errors.calls[0][0]
    assert tracker.stats().requests == 1 and tracker.stats().failed == 4

    with pytest.raises(TrackerError) as caught:
        tracker.close(raise_on_error=True)
    err = caught.value
    assert (err.kind, err.status, err.code) == ("unauthorized", 401, "unauthorized")
    assert isinstance(err.error, Unauthorized) and err.__cause__ is err.error
    assert err.result.failed == 1  # the one tracked after the flush() result

    # Without asking to raise: the default result is not a success either.
    quiet = Tracker("fsk_wrong", base_url=server.base_url, flush_interval=60, on_error=Errors())
    quiet.track("Refused", user_id="u")
    result = quiet.close()
    assert not result and isinstance(result.error, Unauthorized) and result.failed == 1


def test_the_spool_keeps_undelivered_events_across_a_restart_exactly_once(
    server: Server, api_key: str, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    n = 30
    # One event the server already has (same key, same content): its resend
    # from the spool must come back as a duplicate, not a second event.
    with Client(api_key, base_url=server.base_url) as client:
        client.track(
            "Spooled", user_id="u-0", properties={"seq": 0}, occurred_at=AN_HOUR_AGO, idempotency_key="spool-0"
        )

    # A: the server is unreachable; close() spools what it could not deliver.
    errors = Errors()
    a = Tracker(
        api_key, base_url=f"http://127.0.0.1:{free_port()}", on_error=errors, spool_dir=spool, close_timeout=1.0
    )
    keys = [a.track("Spooled", user_id="u-0", properties={"seq": 0}, occurred_at=AN_HOUR_AGO, idempotency_key="spool-0")]
    keys += [a.track("Spooled", user_id=f"u-{i % 3}", properties={"seq": i}) for i in range(1, n)]
    keys.append(a.identify(user_id="u-1", anonymous_id="a-1", traits={"plan": "spooled"}))
    started = time.monotonic()
    result = a.close()
    assert time.monotonic() - started < 1.0 + SLACK
    assert not result and result.spooled == n + 1 and result.failed == 0 and result.timed_out
    assert errors.calls == [], "spooled items are not given to on_error"
    assert result.spool_path is not None
    path = Path(result.spool_path)
    assert spool_files(spool) == [path.name] and path.suffix == ".jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_bytes().splitlines()
    assert [json.loads(x)["idempotency_key"] for x in lines] == keys  # as queued, in order

    # B0: a wrong key does not consume the spool: what came from it goes back.
    b0_errors = Errors()
    b0 = Tracker("fsk_wrong", base_url=server.base_url, on_error=b0_errors, spool_dir=spool)
    b0_result = b0.close()
    assert not b0_result and isinstance(b0_result.error, Unauthorized) and b0_result.spooled == n + 1
    assert [(e.kind, items) for e, items in b0_errors.calls] == [("unauthorized", [])]
    assert sorted(it["idempotency_key"] for it in spooled_items(spool)) == sorted(keys)

    # B1: its first send reaches the server but every answer is lost; it
    # gives up at its deadline and spools the items again (same keys).
    proxy = LosingProxy(server.base_url, lose=10**6)
    try:
        b1 = Tracker(api_key, base_url=proxy.url, spool_dir=spool, close_timeout=1.5, on_error=errors)
        b1_result = b1.close()
    finally:
        proxy.close()
    assert proxy.lost >= 1 and b1_result.spooled == n + 1 and errors.calls == []
    assert [name.endswith(".jsonl") for name in spool_files(spool)] == [True], spool_files(spool)

    # B2, on a working server, sends them first: each already stored one is
    # answered as a duplicate, so every event is stored once.
    b2 = Tracker(api_key, base_url=server.base_url, spool_dir=spool, on_error=errors)
    b2.track("Spooled", user_id="u-2", properties={"seq": n})
    assert b2.close() and errors.calls == []
    st = b2.stats()
    assert st.accepted == n + 2 and st.duplicates == n + 1, st
    assert spool_files(spool) == [], "the delivered spool file is removed"
    assert_exactly_once(server, api_key, "Spooled", n + 1)
    with Client(api_key, base_url=server.base_url) as client:
        assert client.find_contact(anonymous_id="a-1").traits.to_dict() == {"plan": "spooled"}


def test_two_processes_on_one_spool_send_each_item_once(server: Server, api_key: str, tmp_path: Path) -> None:
    """Processes that exited against a dead server spooled their items (the
    exit handler); then two processes start on the same spool at once: each
    file is claimed by one of them, so nothing is sent twice, and a claim
    left by a process that died is taken back."""
    spool = tmp_path / "spool"
    dead = f"http://127.0.0.1:{free_port()}"
    producer = tmp_path / "producer.py"
    producer.write_text(
        textwrap.dedent(
            f"""
            import sys
            from fastack import Tracker
            t = Tracker({api_key!r}, base_url={dead!r}, spool_dir={str(spool)!r}, shutdown_timeout=0.5)
            start = int(sys.argv[1])
            for i in range(start, start + 50):
                t.track("Shared", user_id=f"u-{{i % 7}}", properties={{"seq": i}})
            # no close(): the exit handler spools what it could not deliver
            """
        )
    )
    procs = [
        subprocess.Popen([sys.executable, str(producer), str(start)], env=python_env(), stderr=subprocess.PIPE)
        for start in (0, 50, 100, 150)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    files = spool_files(spool)
    assert len(files) == 4 and all(f.endswith(".jsonl") for f in files), files
    assert len(spooled_items(spool)) == 200
    # One file claimed by a process that is gone (it crashed mid-send).
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    os.rename(spool / files[0], spool / f"{files[0]}.claimed-{int(gone.stdout)}-dead")

    consumer = tmp_path / "consumer.py"
    consumer.write_text(
        textwrap.dedent(
            f"""
            import json
            from fastack import Tracker
            t = Tracker({api_key!r}, base_url={server.base_url!r}, spool_dir={str(spool)!r})
            result = t.close(timeout=60)
            st = t.stats()
            print(json.dumps({{"ok": bool(result), "accepted": st.accepted, "duplicates": st.duplicates}}))
            """
        )
    )
    procs = [
        subprocess.Popen([sys.executable, str(consumer)], env=python_env(), stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        outs.append(json.loads(out))
    assert all(o["ok"] for o in outs), outs
    assert sum(o["accepted"] for o in outs) == 200, outs
    assert sum(o["duplicates"] for o in outs) == 0, f"an item was sent twice: {outs}"
    assert spool_files(spool) == []
    assert_exactly_once(server, api_key, "Shared", 200)


def test_a_spool_line_that_is_not_an_item_is_skipped(server: Server, api_key: str, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    item = {
        "type": "track",
        "event": "Handmade",
        "user_id": "u",
        "properties": {"seq": 0},
        "occurred_at": recent(2),
        "idempotency_key": "handmade-0",
    }
    (spool / f"{time.time_ns():020d}-1-abcd.jsonl").write_text(json.dumps(item) + "\nnot json\n[1]\n")
    tracker = Tracker(api_key, base_url=server.base_url, spool_dir=spool)
    assert tracker.close()
    assert tracker.stats().accepted == 1 and spool_files(spool) == []
    assert_exactly_once(server, api_key, "Handmade", 1)
