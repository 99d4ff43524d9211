"""`Tracker`: fire-and-forget track/identify, batched by a background worker."""

from __future__ import annotations

import atexit
import gzip
import json
import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn

import httpx

from . import _fast, _time
from ._errors import (
    ApiError,
    EventTooLarge,
    FastackError,
    QueueFull,
    TrackerClosed,
    TrackerError,
    TransportError,
    Undelivered,
)
from ._retry import BACKOFF_MAX, retry_delay
from ._spool import Spool
from ._version import __version__

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_FLUSH_TIMEOUT",
    "MAX_BATCH_ITEMS",
    "MAX_EVENT_BYTES",
    "MAX_REQUEST_BYTES",
    "FlushResult",
    "Tracker",
    "TrackerStats",
]

log = logging.getLogger("fastack")

#: Server limits (README "Limits"): one event's JSON, one request, one batch.
MAX_EVENT_BYTES = 32 * 1024
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_BATCH_ITEMS = 500

_HEAD = b'{"batch":['
# Nothing was accepted and the same request may succeed later: 429 (after
# Retry-After), 408 (the body came too slowly), and every 5xx.
_RETRY_STATUSES = frozenset({408, 429})
# Problem codes about an item's content: the rest of the batch is not at fault.
_ITEM_PROBLEMS = frozenset(
    {
        "invalid_json",
        "invalid_payload",
        "payload_too_large",
        "idempotency_key_conflict",
        "occurred_at_in_future",
        "occurred_at_out_of_retention",
    }
)
_TAIL = b"]}"
_ENVELOPE = len(_HEAD) + len(_TAIL)
_FULL_BYTES = MAX_REQUEST_BYTES - _ENVELOPE  # queued bytes (with commas) that fill a request
# Smaller batches are sent as is: compressing them saves little.
_COMPRESS_FROM = 1024
_COMPRESSIONS = (None, "gzip")
# The key is refused: no later request with it will be taken.
_AUTH_STATUSES = frozenset({401, 403})
#: How long flush() / close() wait by default (seconds): an application's
#: shutdown never hangs on its analytics.
DEFAULT_FLUSH_TIMEOUT = 10.0
DEFAULT_CLOSE_TIMEOUT = 10.0
# After close()'s deadline, how long a request still in flight may take to
# notice before close() returns without it.
_JOIN_GRACE = 0.25

ErrorCallback = Callable[[FastackError, "list[dict[str, Any]]"], None]


@dataclass(frozen=True)
class TrackerStats:
    """Counters since the tracker started (`tracker.stats()`)."""

    queued: int  #: items waiting in memory now
    in_flight: int  #: items in batches being sent now
    accepted: int  #: items the server acknowledged (202), duplicates included
    duplicates: int  #: of which the server had seen already (a retry of a lost answer)
    failed: int  #: items given to on_error (rejected, too large, dropped, undelivered)
    dropped: int  #: of which dropped because the queue was full
    requests: int  #: HTTP requests sent
    retries: int  #: requests repeated after a 429, 5xx or connection error
    bytes_sent: int = 0  #: request body bytes sent (after compression)


@dataclass(frozen=True)
class FlushResult:
    """What `flush()` / `close()` did. True (as a bool) only when everything
    was delivered: nothing pending, nothing failed or spooled, no error.

    Failures are counted once: each result counts what failed since the
    previous `flush()` / `close()` result (items given to `on_error` in
    between included), so one ignored result does not hide a failure from
    the next. After a 401/403 every later result carries that error."""

    #: Items tracked before the call and still queued or being retried when
    #: it returned (flush() only: they stay queued; close() gives up on
    #: everything, so its `pending` is 0).
    pending: int = 0
    #: Items that will not be delivered, given to `on_error` (or logged)
    #: since the previous result: refused by the server (401/403/422/...),
    #: too large, dropped, or left at close()'s deadline without a spool.
    failed: int = 0
    #: Items close() (or the exit handler) wrote to the spool: a tracker
    #: started later on the same spool sends them.
    spooled: int = 0
    #: The spool file written, if any.
    spool_path: str | None = None
    #: The deadline passed before everything was delivered.
    timed_out: bool = False
    #: The most serious failure behind the above (`Unauthorized` /
    #: `Forbidden` first; for a deadline, the last error a retry saw).
    error: FastackError | None = None

    @property
    def ok(self) -> bool:
        return not (self.pending or self.failed or self.spooled or self.error is not None)

    @property
    def undelivered(self) -> int:
        """pending + failed + spooled."""
        return self.pending + self.failed + self.spooled

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return "everything delivered"
        parts = []
        if self.pending:
            parts.append(f"{self.pending} still queued")
        if self.spooled:
            parts.append(f"{self.spooled} spooled to {self.spool_path}")
        if self.failed:
            parts.append(f"{self.failed} given to on_error")
        text = f"{self.undelivered} item(s) not delivered" + (f" ({', '.join(parts)})" if parts else "")
        if self.timed_out:
            text += ", deadline reached"
        if self.error is not None:
            text += f"; {self.error.kind}: {self.error}"
        return text


def _is_auth(error: FastackError | None) -> bool:
    return isinstance(error, ApiError) and error.status in _AUTH_STATUSES


def _refuse(name: str, value: Any, max_len: int) -> NoReturn:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    raise ValueError(f"{name} must be 1–{max_len} characters, not {len(value)}")


class _Concurrency:
    """How many batches to keep in flight, found by trying (hill climbing on
    throughput while there is a backlog): one more batch in flight helps
    when the server has idle time per request (PostgreSQL's group commit
    waits for its fsync) and hurts when it has one writer (embedded SQLite).
    Starts at 1; after a window at `limit` it tries `limit + 1` while that
    raised throughput by 5 % or more, steps back otherwise, holds for a
    while, then tries again (conditions change). Not thread-safe: used
    under the tracker's lock."""

    WINDOW_BATCHES = 8
    WINDOW_SECONDS = 0.25
    GAIN = 1.05
    HOLD_WINDOWS = 20

    def __init__(self, ceiling: int, now: float | None = None) -> None:
        self.ceiling = ceiling
        self.limit = 1
        self._rates: dict[int, float] = {}  # throughput last seen at each limit
        self._hold = 0
        self._reset(time.monotonic() if now is None else now)

    def _reset(self, now: float) -> None:
        self._started = now
        self._batches = 0
        self._items = 0

    def idle(self, now: float) -> None:
        """The queue ran dry: what the window measured is the application's
        rate, not ours; start again."""
        self._reset(now)

    def finished(self, items: int, now: float) -> None:
        """A batch was delivered while others waited in the queue."""
        if self.ceiling == 1:
            return
        self._batches += 1
        self._items += items
        elapsed = now - self._started
        if self._batches < self.WINDOW_BATCHES or elapsed < self.WINDOW_SECONDS:
            return
        rate = self._items / elapsed
        self._rates[self.limit] = rate
        self._reset(now)
        if self._hold > 0:
            self._hold -= 1
            return
        lower = self._rates.get(self.limit - 1)
        if lower is not None and rate < lower * self.GAIN:
            # The last step up did not pay: back down, and stay a while.
            self.limit -= 1
            self._hold = self.HOLD_WINDOWS
        elif self.limit < self.ceiling:
            self.limit += 1
        else:
            self._hold = self.HOLD_WINDOWS
        # What was measured at higher limits is stale once we move.
        for higher in [k for k in self._rates if k > self.limit]:
            del self._rates[higher]


class Tracker:
    """Queues `track` / `identify` in memory and sends them in batches from a
    background thread — the application never waits for the network.

    - `track()` / `identify()` return at once with the idempotency key used
      (generated when not given: a random, time-ordered UUID, version 7).
      The item is encoded to JSON at once (later changes to your dicts do
      not leak in). They raise only for arguments that can never be sent (no
      user_id/anonymous_id, an empty or too long name or id, properties that
      are not JSON): `ValueError` / `TypeError`.
    - A worker thread sends batches of at most `max_batch` (≤ 500) items and
      4 MiB, as soon as a batch is full and at least every `flush_interval`
      seconds, with up to `max_inflight` (default 4) batches in flight on
      as many connections: how many is found by trying, from one, while
      there is a backlog (more helps on PostgreSQL, where each request waits
      for a group commit's fsync; it does not on the embedded single
      writer). Identity order is kept whatever is in flight: the
      server resolves identities in the order it accepts items, so a batch
      holding an item that links ids or sets traits (an `identify`, a
      `track` with both `user_id` and `anonymous_id`) is sent alone, after
      everything tracked before it was accepted and before anything tracked
      after it. Batches of plain tracks may overtake each other (their
      events' ids then follow acceptance, not tracking, order).
    - 429 (waiting `Retry-After`), 408, 5xx and connection errors are retried with
      capped exponential backoff and jitter, re-sending the same items with
      the same idempotency keys: a batch is all or nothing on the server, and
      a repeat of an accepted item answers its original id, so nothing is
      lost or doubled. `max_retries=None` (default) retries until delivered
      or closed.
    - A 4xx other than 429 and 408 is not retried. When the problem names
      items (`errors[].index`, e.g. a 422 for one bad item), those items go
      to `on_error` and the rest of the batch is sent again. When it is about
      an item without naming it, the batch is split in halves until the
      culprit is alone.
      Otherwise (415, ...) the whole batch goes to `on_error`.
    - A 401 or 403 (`Unauthorized`, `Forbidden`) is not transient: it is
      logged as an error, the tracker stops sending, and the batch,
      everything still queued and everything tracked later goes to
      `on_error` with that error at once (items read from a spool are kept
      for the spool instead). Every later `flush()` / `close()` result
      carries the error.
    - Batches of 1 KiB or more are sent gzip-compressed (`compression="gzip"`,
      the default; JSON shrinks 5 to 10 times); `compression=None` sends them
      as is. A server that answers 415 to a compressed batch (a release
      before compressed bodies) gets it again as is, and every later one.
    - An item whose JSON is over 32 KiB is not queued: it goes to `on_error`
      (`EventTooLarge`) and never fails a batch.
    - The queue holds at most `max_queue_size` items; past that an item is
      dropped, counted (`stats().dropped`) and given to `on_error`
      (`QueueFull`) — `track()` never blocks.
    - `flush(timeout)` waits until everything tracked before it is
      delivered or reported, at most `flush_timeout` (10 s) by default;
      `close()` flushes and stops, at most `close_timeout` (10 s) by
      default; at interpreter exit every open tracker is closed (waiting at
      most `shutdown_timeout`, 10 s). Both return a `FlushResult` (falsy
      unless everything was delivered) and with `raise_on_error=True`
      raise `TrackerError` instead of returning a falsy one.
    - `spool_dir`: what close() (or the exit handler) could not deliver by
      its deadline is written there, and a tracker started later on the
      same directory sends it first, with the same idempotency keys
      (exactly once). Without it, those items go to `on_error`
      (`Undelivered`).

    `on_error(error, items)` receives every item that will not be delivered,
    as dicts (the JSON sent), with why (`error.kind` names it): an
    `ApiError` (`Unauthorized`, `Forbidden`, ...), `EventTooLarge`,
    `QueueFull`, `TransportError` (retries exhausted), `TrackerClosed` or
    `Undelivered`. It is
    called from the worker thread, or from the calling thread for
    `EventTooLarge` / `QueueFull` / tracking after close; keep it short and
    thread-safe. Without it, these are logged on the `fastack` logger.
    """

    def __init__(
        self,
        api_key: str,
        base_url: str = "http://127.0.0.1:8080",
        flush_interval: float = 0.5,
        max_batch: int = 500,
        max_queue_size: int = 100_000,
        on_error: ErrorCallback | None = None,
        *,
        max_retries: int | None = None,
        timeout: float = 15.0,
        shutdown_timeout: float = 10.0,
        max_inflight: int = 4,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        compression: str | None = "gzip",
        flush_timeout: float = DEFAULT_FLUSH_TIMEOUT,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        spool_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not 1 <= max_batch <= MAX_BATCH_ITEMS:
            raise ValueError(f"max_batch must be 1–{MAX_BATCH_ITEMS}")
        if max_queue_size < 1:
            raise ValueError("max_queue_size must be at least 1")
        if flush_interval <= 0:
            raise ValueError("flush_interval must be positive")
        if max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        if compression not in _COMPRESSIONS:
            raise ValueError(f"compression must be 'gzip' or None, got {compression!r}")
        if not flush_timeout >= 0 or not close_timeout >= 0:
            raise ValueError("flush_timeout and close_timeout must be >= 0 (math.inf: no limit)")
        self._flush_timeout = float(flush_timeout)
        self._close_timeout = float(close_timeout)
        self._compression = compression
        self._api_key = api_key
        self._base_url = base_url.rstrip("/")
        self._flush_interval = float(flush_interval)
        self._max_batch = int(max_batch)
        self._max_queue_size = int(max_queue_size)
        self._on_error = on_error
        self._max_retries = max_retries
        self._timeout = timeout
        self._shutdown_timeout = shutdown_timeout
        self._max_inflight = int(max_inflight)
        self._headers = dict(headers or {})
        self._transport = transport
        self._spool = None if spool_dir is None else Spool(spool_dir)
        self._init_state()
        if self._spool is not None:
            self._load_spool(self._spool)
        _live.add(self)
        self._start()

    # -- state (also rebuilt in a forked child)
    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # workers wait here
        self._done = threading.Condition(self._lock)  # flush() waits here
        self._queue: deque[bytes] = deque()
        self._queue_bytes = 0
        self._seq = 0  # items ever queued; the queue's front item is number _seq - len(_queue)
        self._drain_to = 0  # send every item numbered below this, full batch or not
        self._next_tick = time.monotonic() + self._flush_interval
        # A batch's first item number -> its items not yet delivered or
        # reported (by id): close() takes what is left at its deadline.
        self._inflight: dict[int, dict[int, bytes]] = {}
        self._concurrency = _Concurrency(self._max_inflight)
        # Numbers of queued items that link ids or set traits: the server
        # resolves identities in acceptance order, so a batch holding one is
        # sent alone (nothing else in flight, nothing after it until it is
        # accepted); batches of plain tracks may overtake each other.
        self._ordered: deque[int] = deque()
        self._alone: int | None = None  # the first item number of such a batch in flight
        self._closing = False
        self._closed = False
        self._abort = threading.Event()
        self._accepted = 0
        self._duplicates = 0
        self._failed = 0
        self._dropped = 0
        self._requests = 0
        self._retries = 0
        self._bytes_sent = 0
        # What the results report: failures since the last result, the worst
        # error among them, the last error a retry saw, a refused key.
        self._failed_mark = 0
        self._window_error: FastackError | None = None
        self._retry_error: FastackError | None = None
        self._auth_error: ApiError | None = None
        self._auth_reports = 0
        self._close_result: FlushResult | None = None
        # Items read from the spool: numbers below _spool_end, by id; the
        # claimed files are removed once each is delivered, refused or
        # written back (_respool holds those an auth failure kept).
        self._spool_ids: set[int] = set()
        self._spool_end = 0
        self._claimed: list[Path] = []
        self._respool: list[bytes] = []
        self._workers: list[threading.Thread] = []
        self._http = self._make_http()

    def _make_http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self._base_url,
            headers={
                "authorization": f"Bearer {self._api_key}",
                "content-type": "application/json",
                "user-agent": f"fastack-python/{__version__} (tracker)",
                **self._headers,
            },
            timeout=httpx.Timeout(self._timeout),
            limits=httpx.Limits(
                max_connections=self._max_inflight, max_keepalive_connections=self._max_inflight
            ),
            transport=self._transport,
        )

    def _load_spool(self, spool: Spool) -> None:
        """Puts what earlier trackers spooled at the front of the queue, to
        be sent at once."""
        taken = spool.claim(self._max_queue_size)
        if not taken.files:
            return
        with self._lock:
            for data, obj in zip(taken.items, taken.parsed):
                if obj.get("type") == "identify" or ("user_id" in obj and "anonymous_id" in obj):
                    self._ordered.append(self._seq)
                self._queue.append(data)
                self._queue_bytes += len(data) + 1
                self._spool_ids.add(id(data))
                self._seq += 1
            self._spool_end = self._seq
            self._drain_to = self._seq
            self._claimed = taken.files
        log.info(
            "fastack tracker: sending %d item(s) from the spool %s (%d file(s))",
            len(taken.items),
            spool.dir,
            len(taken.files),
        )

    def _start(self) -> None:
        for i in range(self._max_inflight):
            t = threading.Thread(target=self._run, name=f"fastack-tracker-{i}", daemon=True)
            self._workers.append(t)
            t.start()

    # -- the application's side (hot path: keep it lean)
    def track(
        self,
        event: str,
        *,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        properties: Mapping[str, Any] | None = None,
        occurred_at: _time.TimeLike | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Queues a track event; returns its idempotency key.

        `occurred_at`: a datetime (naive = local time) or an RFC 3339 string
        with an offset (sent as it is); default now with the local offset.
        Raises ValueError/TypeError only for what can never be sent."""
        if not isinstance(event, str) or not 0 < len(event) <= 200:
            _refuse("event", event, 200)
        item: dict[str, Any] = {"type": "track", "event": event}
        _put_ids(item, user_id, anonymous_id)
        if properties is not None:
            item["properties"] = properties
        key = _put_time_and_key(item, occurred_at, idempotency_key)
        # A track with both ids links them: it keeps its place in line.
        self._enqueue(item, user_id is not None and anonymous_id is not None)
        return key

    def identify(
        self,
        *,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        traits: Mapping[str, Any] | None = None,
        occurred_at: _time.TimeLike | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Queues an identify (with both ids: links them); returns its
        idempotency key. Same rules as `track`."""
        item: dict[str, Any] = {"type": "identify"}
        _put_ids(item, user_id, anonymous_id)
        if traits is not None:
            item["traits"] = traits
        key = _put_time_and_key(item, occurred_at, idempotency_key)
        self._enqueue(item, True)
        return key

    def _enqueue(self, item: dict[str, Any], ordered: bool = False) -> None:
        # Encoded now: the caller may reuse its dicts, and a value that is not
        # JSON fails here (TypeError/ValueError) rather than in the worker.
        data = _fast.dumps(item).encode("utf-8")
        size = len(data)
        if size > MAX_EVENT_BYTES:
            with self._lock:
                self._failed += 1
            self._report(EventTooLarge(size, MAX_EVENT_BYTES), [data])
            return
        lock = self._lock
        lock.acquire()
        try:
            if self._closing or self._auth_error is not None:
                # Refused key: fail fast with the same error, never sent.
                self._failed += 1
                problem: FastackError | None = self._auth_error or TrackerClosed("tracked after close()")
            else:
                queue = self._queue
                if len(queue) >= self._max_queue_size:
                    self._dropped += 1
                    self._failed += 1
                    problem = QueueFull(self._dropped)
                else:
                    problem = None
                    if ordered:
                        self._ordered.append(self._seq)
                    queue.append(data)
                    self._queue_bytes += size + 1
                    self._seq += 1
                    if len(queue) % self._max_batch == 0 or self._queue_bytes >= _FULL_BYTES:
                        self._work.notify()
        finally:
            lock.release()
        if problem is not None:
            self._report(problem, [data])

    def flush(self, timeout: float | None = None, *, raise_on_error: bool = False) -> FlushResult:
        """Sends everything queued now and waits until it is delivered (or
        given to on_error), at most `timeout` seconds (None: the tracker's
        `flush_timeout`, 10 s by default; `math.inf`: no limit).

        Returns a `FlushResult`, true as a bool only when everything was
        delivered: `pending` counts what is still queued at the deadline
        (it stays queued and keeps being retried: flush() neither drops nor
        spools), `failed` what went to on_error since the previous result,
        `error` why. With `raise_on_error=True` a result that is not ok is
        raised as a `TrackerError` instead."""
        if threading.current_thread() in self._workers:
            # Called from on_error: waiting here would wait for ourselves.
            with self._lock:
                return FlushResult(pending=len(self._queue) + self._inflight_items(), timed_out=True)
        limit = self._flush_timeout if timeout is None else float(timeout)
        with self._lock:
            target = self._seq
            self._drain_to = max(self._drain_to, target)
            self._work.notify_all()
        done = self._wait(target, time.monotonic() + limit)
        with self._lock:
            pending = 0 if done else self._held_before(target)
            result = self._result(pending=pending, timed_out=not done)
        if not result.ok:
            where = "still queued, retried" if result.pending else ""
            log.warning("fastack tracker: flush(): %s%s", result, f" ({where})" if where else "")
        if raise_on_error and not result.ok:
            raise TrackerError(f"flush(): {result}", result, result.error) from result.error
        return result

    def close(self, timeout: float | None = None, *, raise_on_error: bool = False) -> FlushResult:
        """Flushes and stops the worker, within `timeout` seconds (None: the
        tracker's `close_timeout`, 10 s by default; `math.inf`: no limit).

        What is not delivered by then is given up: written to the spool
        when the tracker has one (`spool_dir`), otherwise given to on_error
        (`Undelivered`); a request still in flight is not waited for past
        the deadline (it may have been stored: the spooled or reported item
        keeps its idempotency key, so a resend is answered as a duplicate).
        Returns a `FlushResult` (true only when everything was delivered;
        `spooled` / `failed` say where the rest went) and logs a warning
        line when not everything was delivered. With `raise_on_error=True`
        a result that is not ok is raised as a `TrackerError`. Items tracked
        after close() go to on_error. Idempotent: a second call answers the
        first call's result."""
        if threading.current_thread() in self._workers:
            raise RuntimeError("close() cannot be called from on_error")
        limit = self._close_timeout if timeout is None else float(timeout)
        started = time.monotonic()
        deadline = started + limit
        with self._lock:
            if self._closed and self._close_result is not None:
                result = self._close_result
                if raise_on_error and not result.ok:
                    raise TrackerError(f"close(): {result}", result, result.error) from result.error
                return result
            self._closing = True
            target = self._seq
            self._drain_to = self._seq
            self._work.notify_all()
        delivered = self._wait(target, deadline)
        if not delivered:
            self._abort.set()
            with self._lock:
                self._work.notify_all()
        for t in self._workers:
            # A request in flight is not waited for past the deadline.
            t.join(None if math.isinf(deadline) else max(0.0, deadline - time.monotonic()) + _JOIN_GRACE)
        with self._lock:
            left = list(self._queue)
            self._queue.clear()
            self._queue_bytes = 0
            for first in sorted(self._inflight):
                left.extend(self._inflight[first].values())
            self._inflight.clear()
            keep, self._respool = self._respool, []
            claimed, self._claimed = self._claimed, []
            self._closed = True
            retry_error = self._retry_error
        spooled = 0
        spool_path: str | None = None
        if left or keep:
            why = f"not delivered within close()'s {limit:g} s deadline"
            if retry_error is not None:
                why += f" (last error: {retry_error})"
            if self._spool is not None:
                try:
                    spool_path = str(self._spool.write(keep + left))
                    spooled = len(keep) + len(left)
                except OSError as exc:
                    log.error("fastack tracker: cannot write the spool %s: %s", self._spool.dir, exc)
                    self._spool.release(claimed)  # what came from there stays there
                    claimed = []
                    self._fail(Undelivered(f"{why}; the spool could not be written: {exc}"), left)
            else:
                self._fail(Undelivered(why), left)
        if claimed and self._spool is not None:
            self._spool.remove(claimed)
        self._http.close()
        _live.discard(self)
        with self._lock:
            result = self._result(pending=0, timed_out=not delivered, spooled=spooled, spool_path=spool_path)
            self._close_result = result
        if not result.ok:
            log.warning("fastack tracker: close() after %.1f s: %s", time.monotonic() - started, result)
        if raise_on_error and not result.ok:
            raise TrackerError(f"close(): {result}", result, result.error) from result.error
        return result

    def _wait(self, target: int, deadline: float) -> bool:
        """Waits until every item numbered below `target` is delivered or
        reported; False when `deadline` (monotonic) passed first."""
        with self._lock:
            while self._lowest_pending() < target:
                if not any(t.is_alive() for t in self._workers):
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(min(left, 1.0))
        return True

    def _held_before(self, target: int) -> int:
        """Items numbered below `target` still queued or in flight (lock held)."""
        front = self._seq - len(self._queue)
        held = min(len(self._queue), max(0, target - front))
        return held + sum(len(b) for first, b in self._inflight.items() if first < target)

    def _inflight_items(self) -> int:
        return sum(len(b) for b in self._inflight.values())

    def _result(
        self, *, pending: int, timed_out: bool, spooled: int = 0, spool_path: str | None = None
    ) -> FlushResult:
        """The result of a flush()/close() (lock held): failures since the
        previous result, then starts counting again."""
        failed = self._failed - self._failed_mark
        self._failed_mark = self._failed
        error = self._auth_error or self._window_error
        self._window_error = None
        if error is None and (pending or spooled):
            error = self._retry_error
        return FlushResult(
            pending=pending, failed=failed, spooled=spooled, spool_path=spool_path, timed_out=timed_out, error=error
        )

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> TrackerStats:
        with self._lock:
            return TrackerStats(
                queued=len(self._queue),
                in_flight=self._inflight_items(),
                accepted=self._accepted,
                duplicates=self._duplicates,
                failed=self._failed,
                dropped=self._dropped,
                requests=self._requests,
                retries=self._retries,
                bytes_sent=self._bytes_sent,
            )

    @property
    def dropped(self) -> int:
        """Items dropped because the queue was full."""
        return self._dropped

    # -- the worker's side
    def _lowest_pending(self) -> int:
        low = self._seq - len(self._queue)
        if self._inflight:
            low = min(low, min(self._inflight))
        return low

    def _sendable(self) -> int:
        """How many queued items may be sent now (lock held): none while a
        batch that keeps identity order is in flight; while others are in
        flight, those before the next such item; otherwise all."""
        if self._alone is not None:
            return 0
        first = self._seq - len(self._queue)
        ordered = self._ordered
        while ordered and ordered[0] < first:
            ordered.popleft()
        if self._inflight and ordered:
            return ordered[0] - first
        return len(self._queue)

    def _take(self, limit: int | None = None) -> tuple[int, list[bytes]]:
        """Pops the next batch (lock held): ≤ max_batch items (and ≤ `limit`),
        ≤ 4 MiB."""
        queue = self._queue
        first = self._seq - len(queue)
        items: list[bytes] = []
        size = _ENVELOPE
        most = self._max_batch if limit is None else min(limit, self._max_batch)
        while queue and len(items) < most:
            n = len(queue[0]) + 1
            if items and size + n > MAX_REQUEST_BYTES:
                break
            items.append(queue.popleft())
            size += n
            self._queue_bytes -= n
        self._inflight[first] = {id(b): b for b in items}
        if self._ordered and self._ordered[0] < first + len(items):
            self._alone = first
        return first, items

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._abort.is_set():
                        return  # close() takes over what is left
                    now = time.monotonic()
                    if now >= self._next_tick:
                        self._drain_to = max(self._drain_to, self._seq)
                        self._next_tick = now + self._flush_interval
                    queue = self._queue
                    if not queue:
                        self._concurrency.idle(now)
                    if queue and len(self._inflight) < self._concurrency.limit and (
                        len(queue) >= self._max_batch
                        or self._queue_bytes >= _FULL_BYTES
                        or self._seq - len(queue) < self._drain_to
                    ):
                        sendable = self._sendable()
                        if sendable > 0:
                            first, items = self._take(sendable)
                            break
                    if self._closing and not queue:
                        return
                    self._work.wait(max(0.0, self._next_tick - now))
            try:
                self._deliver(first, items)
            except Exception as exc:  # never let the worker die
                log.exception("fastack tracker: unexpected error")
                self._fail(TrackerClosed(f"unexpected error: {exc!r}"), items, first)
            with self._lock:
                if self._inflight.get(first) and self._abort.is_set():
                    pass  # close() gave up: it takes what is left of the batch
                else:
                    self._inflight.pop(first, None)
                if len(self._queue) >= self._max_batch:
                    self._concurrency.finished(len(items), time.monotonic())
                if self._alone == first:
                    self._alone = None
                done_with_spool = (
                    bool(self._claimed) and not self._respool and self._lowest_pending() >= self._spool_end
                )
                claimed = self._claimed if done_with_spool else []
                if done_with_spool:
                    self._claimed = []
                self._done.notify_all()
                self._work.notify_all()  # a batch held back for order may go
            if claimed and self._spool is not None:
                # Every item read from the spool is delivered or refused.
                self._spool.remove(claimed)

    def _deliver(self, first: int, items: list[bytes]) -> None:
        """Sends `items` (of the batch numbered `first`) until each is
        delivered or reported, or close() gives up on them."""
        pending = items
        attempt = 0
        while pending:
            if self._abort.is_set():
                return  # close() takes what is left of the batch
            if self._auth_error is not None:
                self._give_up(self._auth_error, pending, first)
                return
            body = _HEAD + b",".join(pending) + _TAIL
            compressed = self._compression == "gzip" and len(body) >= _COMPRESS_FROM
            headers = None
            if compressed:
                # Level 1: most of level 6's gain at a third of its time.
                body = gzip.compress(body, compresslevel=1, mtime=0)
                headers = {"content-encoding": "gzip"}
            with self._lock:
                self._requests += 1
                self._bytes_sent += len(body)
            try:
                resp = self._http.post("/v1/core/batch", content=body, headers=headers)
            except (httpx.TransportError, RuntimeError) as exc:
                if self._abort.is_set():
                    return  # close() closed the connections under us
                if isinstance(exc, RuntimeError):
                    raise
                err: FastackError = TransportError(f"{type(exc).__name__}: {exc}")
                err.__cause__ = exc
                if self._retry_or_fail(attempt, None, None, err, pending, first):
                    attempt += 1
                    continue
                return
            status = resp.status_code
            if status == 202:
                self._accepted_batch(pending, resp, first)
                return
            if status == 415 and compressed:
                # A server without compressed bodies: send as is from now on.
                log.warning("fastack tracker: the server refused a gzip batch (415); sending batches uncompressed")
                self._compression = None
                continue
            problem = ApiError.from_response(status, resp.headers, resp.content)
            if status in _RETRY_STATUSES or status >= 500:
                if self._retry_or_fail(attempt, status, problem.retry_after, problem, pending, first):
                    attempt += 1
                    continue
                return
            if status in _AUTH_STATUSES:
                self._auth_failed(problem, pending, first)
                return
            bad = sorted(
                {e.index for e in problem.errors if e.index is not None and 0 <= e.index < len(pending)}
            )
            if bad and len(bad) < len(pending) and problem.code in _ITEM_PROBLEMS:
                # The problem names the refused items; the others were not
                # accepted either (all or nothing): send them again.
                self._fail(problem, [pending[i] for i in bad], first)
                skip = set(bad)
                pending = [p for i, p in enumerate(pending) if i not in skip]
                attempt = 0
                continue
            if not bad and len(pending) > 1 and problem.code in _ITEM_PROBLEMS:
                # About some item, without saying which: find it by halves;
                # the good halves go through.
                half = len(pending) // 2
                self._deliver(first, pending[:half])
                pending = pending[half:]
                continue
            self._fail(problem, pending, first)
            return

    def _retry_or_fail(
        self,
        attempt: int,
        status: int | None,
        retry_after: float | None,
        error: FastackError,
        pending: list[bytes],
        first: int,
    ) -> bool:
        """Sleeps before a retry and returns True; or reports the items and
        returns False when retries are exhausted, or returns False when
        close() gave up (close() then takes the items)."""
        with self._lock:
            self._retry_error = error
        if self._max_retries is not None and attempt >= self._max_retries:
            self._fail(error, pending, first)
            return False
        with self._lock:
            self._retries += 1
        if self._abort.wait(retry_delay(status, retry_after, attempt, cap=BACKOFF_MAX)):
            return False
        return True

    def _auth_failed(self, error: ApiError, pending: list[bytes], first: int) -> None:
        """A 401/403: the key is refused. Stop sending; this batch and
        everything queued fail with the error at once, as will every item
        tracked later."""
        with self._lock:
            new = self._auth_error is None
            if new:
                self._auth_error = error
            queued = list(self._queue)
            self._queue.clear()
            self._queue_bytes = 0
            self._done.notify_all()
        if new:
            log.error(
                "fastack tracker: the server refused the API key (%s); the tracker stops sending: every item "
                "held or tracked from now on goes to on_error as %s (kind %r)",
                error,
                type(error).__name__,
                error.kind,
            )
        reported = self._give_up(error, pending, first) + self._give_up(error, queued, None)
        if new and not reported and self._on_error is not None:
            # Only items from the spool (kept for it): on_error still hears of the key.
            try:
                self._on_error(error, [])
            except Exception:
                log.exception("fastack tracker: on_error raised")

    def _give_up(self, error: FastackError, items: list[bytes], first: int | None) -> int:
        """Items a refused key cannot deliver: to on_error, except those read
        from a spool, which are kept to be written back to it (a tracker with
        a working key will send them)."""
        if self._spool_ids:
            with self._lock:
                items = self._settle(items, first)
                keep = [b for b in items if id(b) in self._spool_ids]
                if keep:
                    self._respool.extend(keep)
                    items = [b for b in items if id(b) not in self._spool_ids]
            return self._fail(error, items, None)
        return self._fail(error, items, first)

    def _settle(self, items: list[bytes], first: int | None) -> list[bytes]:
        """Marks `items` of batch `first` as done (lock held); returns those
        that were still open (close() may have taken the rest)."""
        if first is None:
            return items
        open_ = self._inflight.get(first)
        if open_ is None:
            return []
        return [b for b in items if open_.pop(id(b), None) is not None]

    def _accepted_batch(self, pending: list[bytes], resp: httpx.Response, first: int) -> None:
        # {"items":[{"duplicate":false,"id":"…"},…]}: counted without parsing.
        body = resp.content
        acks = body.count(b'"id"')
        duplicates = body.count(b'"duplicate":true')
        if acks != len(pending):
            log.warning("fastack tracker: %d items sent, %d acknowledged: %.200r", len(pending), acks, body)
        with self._lock:
            self._settle(pending, first)
            self._accepted += len(pending)
            self._duplicates += duplicates

    def _fail(self, error: FastackError, items: list[bytes], first: int | None = None) -> int:
        """Reports the items of batch `first` still open; returns how many."""
        with self._lock:
            items = self._settle(items, first)
            self._failed += len(items)
        if items:
            self._report(error, items)
        return len(items)

    def _report(self, error: FastackError, items: list[bytes]) -> None:
        with self._lock:
            # The worst error since the last result: a refused key first.
            if self._window_error is None or (_is_auth(error) and not _is_auth(self._window_error)):
                self._window_error = error
        if self._on_error is None:
            if isinstance(error, QueueFull) and error.dropped not in (1, 10, 100) and error.dropped % 1000:
                return  # do not flood the log while dropping
            if error is self._auth_error:
                self._auth_reports += 1
                n = self._auth_reports
                if n not in (1, 10, 100) and n % 1000:
                    return  # the refusal was logged as an error already; do not flood
            log.warning("fastack tracker: %d item(s) not delivered: %s", len(items), error)
            return
        try:
            self._on_error(error, [json.loads(b) for b in items])
        except Exception:
            log.exception("fastack tracker: on_error raised")

    # -- process life
    def _after_fork(self) -> None:
        # The parent's worker owns what was queued before the fork; the child
        # starts empty with new locks, a new connection pool and new workers.
        if self._closing:
            return
        self._init_state()
        self._start()

    def _atexit(self) -> None:
        try:
            self.close(self._shutdown_timeout)
        except Exception:
            log.exception("fastack tracker: close at exit failed")


_live: weakref.WeakSet[Tracker] = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for tracker in list(_live):
        tracker._atexit()


def _after_fork_in_child() -> None:
    for tracker in list(_live):
        tracker._after_fork()


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _put_ids(item: dict[str, Any], user_id: str | None, anonymous_id: str | None) -> None:
    """The ids of a track or identify item, checked as the server would."""
    if user_id is not None:
        if not isinstance(user_id, str) or not 0 < len(user_id) <= 255:
            _refuse("user_id", user_id, 255)
        item["user_id"] = user_id
    elif anonymous_id is None:
        raise ValueError("one of user_id or anonymous_id is required")
    if anonymous_id is not None:
        if not isinstance(anonymous_id, str) or not 0 < len(anonymous_id) <= 255:
            _refuse("anonymous_id", anonymous_id, 255)
        item["anonymous_id"] = anonymous_id


def _put_time_and_key(
    item: dict[str, Any], occurred_at: _time.TimeLike | None, idempotency_key: str | None
) -> str:
    """`occurred_at` (default now) and the idempotency key (generated when
    not given) of an item; returns the key."""
    item["occurred_at"] = _fast.now() if occurred_at is None else _time.format_time(occurred_at)
    if idempotency_key is None:
        key = _fast.new_key()
    else:
        if not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 255:
            _refuse("idempotency_key", idempotency_key, 255)
        key = idempotency_key
    item["idempotency_key"] = key
    return key
