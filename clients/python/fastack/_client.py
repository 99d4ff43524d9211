"""`Client` (blocking) and `AsyncClient` (asyncio) over the generated layer."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping, Sequence
from typing import IO, Any, Callable, Literal, TypeVar, Union, overload
from urllib.parse import quote

import httpx

from . import _fast, _time
from ._errors import ApiError, TransportError, parse_retry_after
from ._generated.api.ingest import batch as _batch
from ._generated.api.ingest import identify as _identify
from ._generated.api.ingest import track as _track
from ._generated.api.jobs import create_export as _create_export
from ._generated.api.jobs import get_job as _get_job
from ._generated.api.jobs import list_jobs as _list_jobs
from ._generated.api.privacy import create_erasure as _create_erasure
from ._generated.api.privacy import lift_suppression as _lift_suppression
from ._generated.api.privacy import list_suppressions as _list_suppressions
from ._generated.api.read import find_contact as _find_contact
from ._generated.api.read import get_contact as _get_contact
from ._generated.api.read import list_events as _list_events
from ._generated.client import AuthenticatedClient
from ._generated.models import (
    Ack,
    BatchAck,
    BatchIdentify,
    BatchIdentifyTraits,
    BatchRequest,
    BatchTrack,
    BatchTrackProperties,
    ContactOut,
    EventOut,
    EventsPage,
    ErasureAccepted,
    ErasureRequestBody,
    ErasureRequestBodyMetadata,
    ExportAccepted,
    ExportRequest,
    ExportRequestMetadata,
    IdentifyRequest,
    IdentifyRequestTraits,
    IdentifyType,
    JobList,
    JobOut,
    JobState,
    Problem,
    SubjectOut,
    SuppressionLifted,
    SuppressionList,
    SuppressionOut,
    TrackRequest,
    TrackRequestProperties,
    TrackType,
)
from ._generated.types import UNSET, Response, Unset
from ._retry import retry_delay
from ._version import __version__

__all__ = ["DEFAULT_BASE_URL", "AsyncClient", "Client"]

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
USER_AGENT = f"fastack-python/{__version__}"
TERMINAL_JOB_STATES = ("completed", "failed")

T = TypeVar("T")
IdLike = Union[str, uuid.UUID]
BatchItem = Union[BatchTrack, BatchIdentify]
BatchItemLike = Union[BatchTrack, BatchIdentify, Mapping[str, Any]]


class _TrackWithExtra(BatchTrack):
    """A batch track sent with members the document does not name: the
    server refuses them (`unknown_field`), so a typo is not dropped here."""

    extra: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), **self.extra}


class _IdentifyWithExtra(BatchIdentify):
    extra: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), **self.extra}


# --- request bodies (shared by both clients) -------------------------------


def _need_identity(user_id: str | None, anonymous_id: str | None) -> None:
    if user_id is None and anonymous_id is None:
        raise ValueError("one of user_id or anonymous_id is required")


def _track_body(
    event: str,
    user_id: str | None,
    anonymous_id: str | None,
    properties: Mapping[str, Any] | None,
    occurred_at: _time.TimeLike | None,
    idempotency_key: str | None,
    sent_at: _time.TimeLike | None,
) -> TrackRequest:
    _need_identity(user_id, anonymous_id)
    return TrackRequest(
        event=event,
        occurred_at=_time.parse_time(occurred_at) if occurred_at is not None else _now(),
        idempotency_key=idempotency_key if idempotency_key is not None else _fast.new_key(),
        user_id=user_id if user_id is not None else UNSET,
        anonymous_id=anonymous_id if anonymous_id is not None else UNSET,
        properties=TrackRequestProperties.from_dict(properties) if properties is not None else UNSET,
        sent_at=_time.parse_time(sent_at) if sent_at is not None else UNSET,
    )


def _identify_body(
    user_id: str | None,
    anonymous_id: str | None,
    traits: Mapping[str, Any] | None,
    occurred_at: _time.TimeLike | None,
    idempotency_key: str | None,
    sent_at: _time.TimeLike | None,
) -> IdentifyRequest:
    _need_identity(user_id, anonymous_id)
    return IdentifyRequest(
        occurred_at=_time.parse_time(occurred_at) if occurred_at is not None else _now(),
        idempotency_key=idempotency_key if idempotency_key is not None else _fast.new_key(),
        user_id=user_id if user_id is not None else UNSET,
        anonymous_id=anonymous_id if anonymous_id is not None else UNSET,
        traits=IdentifyRequestTraits.from_dict(traits) if traits is not None else UNSET,
        sent_at=_time.parse_time(sent_at) if sent_at is not None else UNSET,
    )


def _batch_body(items: Sequence[BatchItemLike]) -> BatchRequest:
    out: list[BatchTrack | BatchIdentify] = []
    for item in items:
        if isinstance(item, (BatchTrack, BatchIdentify)):
            out.append(item)
            continue
        d = dict(item)
        kind = d.pop("type", None)
        if kind not in ("track", "identify"):
            raise ValueError("a batch item needs its type: 'track' or 'identify'")
        occurred_at = d.pop("occurred_at", None)
        key = d.pop("idempotency_key", None)
        sent_at = d.pop("sent_at", None)
        common: dict[str, Any] = {
            "occurred_at": _time.parse_time(occurred_at) if occurred_at is not None else _now(),
            "idempotency_key": key if key is not None else _fast.new_key(),
            "user_id": d.pop("user_id", UNSET),
            "anonymous_id": d.pop("anonymous_id", UNSET),
            "sent_at": _time.parse_time(sent_at) if sent_at is not None else UNSET,
        }
        parsed: _TrackWithExtra | _IdentifyWithExtra
        if kind == "track":
            properties = d.pop("properties", None)
            parsed = _TrackWithExtra(
                type_=TrackType.TRACK,
                event=d.pop("event", ""),
                properties=BatchTrackProperties.from_dict(properties) if properties is not None else UNSET,
                **common,
            )
        else:
            traits = d.pop("traits", None)
            parsed = _IdentifyWithExtra(
                type_=IdentifyType.IDENTIFY,
                traits=BatchIdentifyTraits.from_dict(traits) if traits is not None else UNSET,
                **common,
            )
        # Anything else is sent as it is (the server refuses unknown fields
        # with `unknown_field`, so a typo is not silently dropped).
        parsed.extra = d
        out.append(parsed)
    return BatchRequest(batch=out)


def _export_body(
    from_: _time.TimeLike,
    to: _time.TimeLike,
    event: str | None,
    metadata: Mapping[str, Any] | None,
) -> ExportRequest:
    return ExportRequest(
        from_=_time.parse_time(from_),
        to=_time.parse_time(to),
        event=event if event is not None else UNSET,
        metadata=ExportRequestMetadata.from_dict(metadata) if metadata is not None else UNSET,
    )


def _erasure_body(
    user_ids: Sequence[str] | None,
    anonymous_ids: Sequence[str] | None,
    contact_ids: Sequence[IdLike] | None,
    suppress: bool,
    from_: _time.TimeLike | None,
    to: _time.TimeLike | None,
    metadata: Mapping[str, Any] | None,
) -> ErasureRequestBody:
    if not (user_ids or anonymous_ids or contact_ids):
        raise ValueError("name at least one person: user_ids, anonymous_ids or contact_ids")
    return ErasureRequestBody(
        user_ids=list(user_ids) if user_ids else UNSET,
        anonymous_ids=list(anonymous_ids) if anonymous_ids else UNSET,
        contact_ids=[uuid.UUID(str(c)) for c in contact_ids] if contact_ids else UNSET,
        suppress=suppress,
        from_=_time.parse_time(from_) if from_ is not None else UNSET,
        to=_time.parse_time(to) if to is not None else UNSET,
        metadata=ErasureRequestBodyMetadata.from_dict(metadata) if metadata is not None else UNSET,
    )


def _events_args(
    from_: _time.TimeLike,
    to: _time.TimeLike,
    contact_id: IdLike | None,
    event: str | None,
    limit: int | None,
    cursor: str | None,
    user_id: str | None = None,
    anonymous_id: str | None = None,
) -> dict[str, Any]:
    if sum(x is not None for x in (contact_id, user_id, anonymous_id)) > 1:
        raise ValueError("give at most one of contact_id, user_id or anonymous_id")
    return {
        "from_": _time.parse_time(from_),
        "to": _time.parse_time(to),
        "contact_id": uuid.UUID(str(contact_id)) if contact_id is not None else UNSET,
        "user_id": user_id if user_id is not None else UNSET,
        "anonymous_id": anonymous_id if anonymous_id is not None else UNSET,
        "event": event if event is not None else UNSET,
        "limit": limit if limit is not None else UNSET,
        "cursor": cursor if cursor is not None else UNSET,
    }


def _contact_query(user_id: str | None, anonymous_id: str | None) -> dict[str, Any]:
    if (user_id is None) == (anonymous_id is None):
        raise ValueError("give exactly one of user_id or anonymous_id")
    return {
        "user_id": user_id if user_id is not None else UNSET,
        "anonymous_id": anonymous_id if anonymous_id is not None else UNSET,
    }


def _now() -> datetime.datetime:
    return datetime.datetime.now().astimezone()


def _parsed(resp: Response[Union[T, Problem]]) -> T:
    parsed = resp.parsed
    # A 2xx the document does not describe, or a problem under a 2xx status:
    # the raw response is the most faithful error.
    if parsed is None or isinstance(parsed, Problem):
        raise ApiError.from_response(int(resp.status_code), resp.headers, resp.content)
    return parsed


def _job_path(job_id: IdLike) -> str:
    return f"/v1/core/jobs/{quote(str(job_id), safe='')}/result"


def _split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    rest = b""
    for chunk in chunks:
        rest += chunk
        *lines, rest = rest.split(b"\n")
        yield from (line for line in lines if line.strip())
    if rest.strip():
        yield rest


class _Policy:
    """When to retry: 408, 429 and 503 always (nothing was accepted); other 5xx
    and transport errors after the request was sent only for idempotent
    requests (reads, and ingest requests, which carry idempotency keys);
    a refused connection always (nothing was sent)."""

    def __init__(self, max_retries: int) -> None:
        self.max_retries = max_retries

    def on_status(self, resp: httpx.Response | Response[Any], attempt: int, idempotent: bool) -> float | None:
        status = int(resp.status_code)
        if attempt >= self.max_retries:
            return None
        if status in (408, 429, 503) or (idempotent and status >= 500):
            return retry_delay(status, parse_retry_after(resp.headers.get("retry-after")), attempt)
        return None

    def on_transport(self, exc: httpx.TransportError, attempt: int, idempotent: bool) -> float | None:
        if attempt >= self.max_retries:
            return None
        if idempotent or isinstance(exc, httpx.ConnectError):
            return retry_delay(None, None, attempt)
        return None


def _make_api(
    api_key: str,
    base_url: str,
    timeout: float,
    headers: Mapping[str, str] | None,
    transport: Any,
) -> AuthenticatedClient:
    return AuthenticatedClient(
        base_url=base_url.rstrip("/"),
        token=api_key,
        timeout=httpx.Timeout(timeout),
        headers={"user-agent": USER_AGENT, **(headers or {})},
        raise_on_unexpected_status=False,
        httpx_args={"transport": transport} if transport is not None else {},
    )


# --- blocking client ---------------------------------------------------------


class Client:
    """The fastack API, blocking (thread-safe; one connection pool).

    Every call raises `fastack.ApiError` for an error answer (the problem's
    `status`, `code`, `detail`, `errors`) and `fastack.TransportError` when no
    answer came. 429 and 503 are retried (honouring `Retry-After`), up to
    `max_retries` times, as are connection errors and 5xx for requests that
    are safe to repeat (reads; ingest, whose idempotency key makes a repeat
    answer the original id).

    The generated layer is available as `client.api` (an
    `AuthenticatedClient` of `fastack._generated`) for anything not wrapped.
    `transport` is passed to httpx (e.g. `httpx.MockTransport` in tests).
    """

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.api = _make_api(api_key, base_url, timeout, headers, transport)
        self._policy = _Policy(max_retries)

    # -- plumbing
    def _call(self, fn: Callable[[], Response[Union[T, Problem]]], *, ok: int, idempotent: bool) -> T:
        attempt = 0
        while True:
            try:
                resp = fn()
            except httpx.TransportError as exc:
                delay = self._policy.on_transport(exc, attempt, idempotent)
                if delay is None:
                    raise TransportError(f"{type(exc).__name__}: {exc}") from exc
            else:
                if int(resp.status_code) == ok:
                    return _parsed(resp)
                delay = self._policy.on_status(resp, attempt, idempotent)
                if delay is None:
                    raise ApiError.from_response(int(resp.status_code), resp.headers, resp.content)
            time.sleep(delay)
            attempt += 1

    def close(self) -> None:
        """Closes the connection pool."""
        self.api.get_httpx_client().close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ingest
    def track(
        self,
        event: str,
        *,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        properties: Mapping[str, Any] | None = None,
        occurred_at: _time.TimeLike | None = None,
        idempotency_key: str | None = None,
        sent_at: _time.TimeLike | None = None,
    ) -> Ack:
        """`POST /v1/core/track`; returns the `Ack` (`id`, `duplicate`).

        `occurred_at` defaults to now (local offset); a naive datetime is
        local time. `idempotency_key` defaults to a random UUID: pass your own
        to make retries across processes safe."""
        body = _track_body(event, user_id, anonymous_id, properties, occurred_at, idempotency_key, sent_at)
        return self._call(lambda: _track.sync_detailed(client=self.api, body=body), ok=202, idempotent=True)

    def identify(
        self,
        *,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        traits: Mapping[str, Any] | None = None,
        occurred_at: _time.TimeLike | None = None,
        idempotency_key: str | None = None,
        sent_at: _time.TimeLike | None = None,
    ) -> Ack:
        """`POST /v1/core/identify`; returns the `Ack`."""
        body = _identify_body(user_id, anonymous_id, traits, occurred_at, idempotency_key, sent_at)
        return self._call(
            lambda: _identify.sync_detailed(client=self.api, body=body), ok=202, idempotent=True
        )

    def batch(self, items: Sequence[BatchItemLike]) -> list[Ack]:
        """`POST /v1/core/batch` with 1–500 items, all accepted or none.

        Items are `BatchItem` models or dicts shaped like the JSON
        (`{"type": "track", "event": ..., "user_id": ...}`); a dict without
        `idempotency_key` / `occurred_at` gets a random key / now. Returns one
        `Ack` per item, in order."""
        body = _batch_body(items)
        ack: BatchAck = self._call(
            lambda: _batch.sync_detailed(client=self.api, body=body), ok=202, idempotent=True
        )
        return list(ack.items)

    # -- reads
    def events_page(
        self,
        from_: _time.TimeLike,
        to: _time.TimeLike,
        *,
        contact_id: IdLike | None = None,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        event: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> EventsPage:
        """One page of `GET /v1/core/events` (`events`, `next_cursor`); one
        person's events by at most one of `contact_id`, `user_id` or
        `anonymous_id`."""
        args = _events_args(from_, to, contact_id, event, limit, cursor, user_id, anonymous_id)
        return self._call(
            lambda: _list_events.sync_detailed(client=self.api, **args), ok=200, idempotent=True
        )

    def events(
        self,
        from_: _time.TimeLike,
        to: _time.TimeLike,
        *,
        contact_id: IdLike | None = None,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        event: str | None = None,
        page_size: int = 1000,
    ) -> Iterator[EventOut]:
        """Every event with `from_ <= occurred_at < to` (ordered by
        `occurred_at`, then id), following `next_cursor` page after page.
        `page_size` is the request's `limit` (1–1000)."""
        cursor: str | None = None
        while True:
            page = self.events_page(
                from_,
                to,
                contact_id=contact_id,
                user_id=user_id,
                anonymous_id=anonymous_id,
                event=event,
                limit=page_size,
                cursor=cursor,
            )
            yield from page.events
            if isinstance(page.next_cursor, Unset) or not page.next_cursor:
                return
            cursor = page.next_cursor

    def get_contact(self, contact_id: IdLike) -> ContactOut:
        """`GET /v1/core/contacts/{id}` (ApiError 404 `not_found` if unknown)."""
        return self._call(
            lambda: _get_contact.sync_detailed(str(contact_id), client=self.api), ok=200, idempotent=True
        )

    def find_contact(self, *, user_id: str | None = None, anonymous_id: str | None = None) -> ContactOut:
        """`GET /v1/core/contacts?user_id=|anonymous_id=` (exactly one)."""
        query = _contact_query(user_id, anonymous_id)
        return self._call(
            lambda: _find_contact.sync_detailed(client=self.api, **query), ok=200, idempotent=True
        )

    # -- exports and jobs
    def create_export(
        self,
        from_: _time.TimeLike,
        to: _time.TimeLike,
        *,
        event: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """`POST /v1/core/exports`; returns the job id. Not repeated after a
        lost answer (it would start a second export); 429/503 are retried."""
        body = _export_body(from_, to, event, metadata)
        acc: ExportAccepted = self._call(
            lambda: _create_export.sync_detailed(client=self.api, body=body), ok=202, idempotent=False
        )
        return str(acc.job_id)

    def get_job(self, job_id: IdLike) -> JobOut:
        """`GET /v1/core/jobs/{id}`."""
        return self._call(
            lambda: _get_job.sync_detailed(str(job_id), client=self.api), ok=200, idempotent=True
        )

    def list_jobs(self, *, status: str | None = None, limit: int | None = None) -> list[JobOut]:
        """`GET /v1/core/jobs`: newest first; `status` one of queued,
        processing, completed, failed; `limit` 1–500 (default 50)."""
        st = JobState(status) if status is not None else UNSET
        lim = limit if limit is not None else UNSET
        jobs: JobList = self._call(
            lambda: _list_jobs.sync_detailed(client=self.api, status=st, limit=lim), ok=200, idempotent=True
        )
        return list(jobs.jobs)

    # -- privacy
    def erase(
        self,
        *,
        user_ids: Sequence[str] | None = None,
        anonymous_ids: Sequence[str] | None = None,
        contact_ids: Sequence[IdLike] | None = None,
        suppress: bool = False,
        from_: _time.TimeLike | None = None,
        to: _time.TimeLike | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """`POST /v1/core/erasures`: erases the people named (1–5,000
        identifiers in all) from every store; with `from_`/`to` only what
        occurred in that window (the contact stays); with `suppress` their
        future events are dropped too. Returns the job id: `wait()` for its
        certificate (`job.result`). Not repeated after a lost answer;
        429/503 are retried (a second request is harmless anyway)."""
        body = _erasure_body(user_ids, anonymous_ids, contact_ids, suppress, from_, to, metadata)
        acc: ErasureAccepted = self._call(
            lambda: _create_erasure.sync_detailed(client=self.api, body=body), ok=202, idempotent=False
        )
        return str(acc.job_id)

    def suppressions(
        self, *, user_id: str | None = None, anonymous_id: str | None = None, limit: int | None = None
    ) -> list[SuppressionOut]:
        """`GET /v1/core/suppressions`: suppressed identifiers by hash, newest
        first; with `user_id` or `anonymous_id`, whether that one is."""
        lim = limit if limit is not None else UNSET
        u = user_id if user_id is not None else UNSET
        a = anonymous_id if anonymous_id is not None else UNSET
        found: SuppressionList = self._call(
            lambda: _list_suppressions.sync_detailed(client=self.api, user_id=u, anonymous_id=a, limit=lim),
            ok=200,
            idempotent=True,
        )
        return list(found.suppressions)

    def lift_suppression(self, *, user_id: str | None = None, anonymous_id: str | None = None) -> SubjectOut:
        """`DELETE /v1/core/suppressions`: the identifier's events are
        processed again from now on (ApiError 404 when it is not
        suppressed). Exactly one of `user_id` or `anonymous_id`."""
        query = _contact_query(user_id, anonymous_id)
        lifted: SuppressionLifted = self._call(
            lambda: _lift_suppression.sync_detailed(client=self.api, **query), ok=200, idempotent=True
        )
        return lifted.lifted

    def wait(self, job_id: IdLike, *, timeout: float = 300.0, poll_interval: float = 0.5) -> JobOut:
        """Polls the job until it is `completed` or `failed` and returns it
        (check `job.status`: a failed job is returned, not raised; its
        `metadata["error"]` says why). Raises `TimeoutError` after `timeout`
        seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.status in TERMINAL_JOB_STATES:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout} s")
            time.sleep(min(poll_interval, left))

    @overload
    def stream_export(self, job_id: IdLike, *, raw: Literal[False] = ...) -> Iterator[EventOut]: ...
    @overload
    def stream_export(self, job_id: IdLike, *, raw: Literal[True]) -> Iterator[bytes]: ...

    def stream_export(self, job_id: IdLike, *, raw: bool = False) -> Iterator[Any]:
        """Streams `GET /v1/core/jobs/{id}/result` (an export's NDJSON)
        without holding it in memory: yields one `EventOut` per line, or with
        `raw=True` each line's bytes (without the newline).

        A job that is not completed raises `ApiError` (409
        `job_not_completed`) at the first `next()`. The HTTP response is
        closed when the iteration ends; if you stop early, call `.close()` on
        the iterator (or use `contextlib.closing`)."""
        resp = self._open_stream(job_id)
        try:
            for line in _split_lines(resp.iter_bytes()):
                yield line if raw else EventOut.from_dict(json.loads(line))
        except httpx.TransportError as exc:  # mid-stream: not retried (lines were already given)
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            resp.close()

    def download_export(self, job_id: IdLike, out: IO[bytes]) -> int:
        """Writes the export's NDJSON bytes, exactly as sent, to `out`
        (e.g. to check `result.hmac`); returns the number of bytes."""
        n = 0
        resp = self._open_stream(job_id)
        try:
            for chunk in resp.iter_bytes():
                out.write(chunk)
                n += len(chunk)
        except httpx.TransportError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            resp.close()
        return n

    def _open_stream(self, job_id: IdLike) -> httpx.Response:
        hc = self.api.get_httpx_client()
        attempt = 0
        while True:
            try:
                resp = hc.send(hc.build_request("GET", _job_path(job_id)), stream=True)
            except httpx.TransportError as exc:
                delay = self._policy.on_transport(exc, attempt, True)
                if delay is None:
                    raise TransportError(f"{type(exc).__name__}: {exc}") from exc
            else:
                if resp.status_code == 200:
                    return resp
                try:
                    resp.read()
                finally:
                    resp.close()
                delay = self._policy.on_status(resp, attempt, True)
                if delay is None:
                    raise ApiError.from_response(resp.status_code, resp.headers, resp.content)
            time.sleep(delay)
            attempt += 1


# --- asyncio client ----------------------------------------------------------


class AsyncClient:
    """The same API as `Client`, with coroutines (`await client.track(...)`),
    `async for` over `events()` and `stream_export()`, and `async with`.
    One instance per event loop."""

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api = _make_api(api_key, base_url, timeout, headers, transport)
        self._policy = _Policy(max_retries)

    async def _call(self, fn: Callable[[], Awaitable[Response[Union[T, Problem]]]], *, ok: int, idempotent: bool) -> T:
        attempt = 0
        while True:
            try:
                resp = await fn()
            except httpx.TransportError as exc:
                delay = self._policy.on_transport(exc, attempt, idempotent)
                if delay is None:
                    raise TransportError(f"{type(exc).__name__}: {exc}") from exc
            else:
                if int(resp.status_code) == ok:
                    return _parsed(resp)
                delay = self._policy.on_status(resp, attempt, idempotent)
                if delay is None:
                    raise ApiError.from_response(int(resp.status_code), resp.headers, resp.content)
            await asyncio.sleep(delay)
            attempt += 1

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self.api.get_async_httpx_client().aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def track(
        self,
        event: str,
        *,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        properties: Mapping[str, Any] | None = None,
        occurred_at: _time.TimeLike | None = None,
        idempotency_key: str | None = None,
        sent_at: _time.TimeLike | None = None,
    ) -> Ack:
        body = _track_body(event, user_id, anonymous_id, properties, occurred_at, idempotency_key, sent_at)
        return await self._call(
            lambda: _track.asyncio_detailed(client=self.api, body=body), ok=202, idempotent=True
        )

    async def identify(
        self,
        *,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        traits: Mapping[str, Any] | None = None,
        occurred_at: _time.TimeLike | None = None,
        idempotency_key: str | None = None,
        sent_at: _time.TimeLike | None = None,
    ) -> Ack:
        body = _identify_body(user_id, anonymous_id, traits, occurred_at, idempotency_key, sent_at)
        return await self._call(
            lambda: _identify.asyncio_detailed(client=self.api, body=body), ok=202, idempotent=True
        )

    async def batch(self, items: Sequence[BatchItemLike]) -> list[Ack]:
        body = _batch_body(items)
        ack: BatchAck = await self._call(
            lambda: _batch.asyncio_detailed(client=self.api, body=body), ok=202, idempotent=True
        )
        return list(ack.items)

    async def events_page(
        self,
        from_: _time.TimeLike,
        to: _time.TimeLike,
        *,
        contact_id: IdLike | None = None,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        event: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> EventsPage:
        args = _events_args(from_, to, contact_id, event, limit, cursor, user_id, anonymous_id)
        return await self._call(
            lambda: _list_events.asyncio_detailed(client=self.api, **args), ok=200, idempotent=True
        )

    async def events(
        self,
        from_: _time.TimeLike,
        to: _time.TimeLike,
        *,
        contact_id: IdLike | None = None,
        user_id: str | None = None,
        anonymous_id: str | None = None,
        event: str | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[EventOut]:
        cursor: str | None = None
        while True:
            page = await self.events_page(
                from_,
                to,
                contact_id=contact_id,
                user_id=user_id,
                anonymous_id=anonymous_id,
                event=event,
                limit=page_size,
                cursor=cursor,
            )
            for ev in page.events:
                yield ev
            if isinstance(page.next_cursor, Unset) or not page.next_cursor:
                return
            cursor = page.next_cursor

    async def get_contact(self, contact_id: IdLike) -> ContactOut:
        return await self._call(
            lambda: _get_contact.asyncio_detailed(str(contact_id), client=self.api), ok=200, idempotent=True
        )

    async def find_contact(
        self, *, user_id: str | None = None, anonymous_id: str | None = None
    ) -> ContactOut:
        query = _contact_query(user_id, anonymous_id)
        return await self._call(
            lambda: _find_contact.asyncio_detailed(client=self.api, **query), ok=200, idempotent=True
        )

    async def create_export(
        self,
        from_: _time.TimeLike,
        to: _time.TimeLike,
        *,
        event: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        body = _export_body(from_, to, event, metadata)
        acc: ExportAccepted = await self._call(
            lambda: _create_export.asyncio_detailed(client=self.api, body=body), ok=202, idempotent=False
        )
        return str(acc.job_id)

    async def get_job(self, job_id: IdLike) -> JobOut:
        return await self._call(
            lambda: _get_job.asyncio_detailed(str(job_id), client=self.api), ok=200, idempotent=True
        )

    async def list_jobs(self, *, status: str | None = None, limit: int | None = None) -> list[JobOut]:
        st = JobState(status) if status is not None else UNSET
        lim = limit if limit is not None else UNSET
        jobs: JobList = await self._call(
            lambda: _list_jobs.asyncio_detailed(client=self.api, status=st, limit=lim),
            ok=200,
            idempotent=True,
        )
        return list(jobs.jobs)

    async def erase(
        self,
        *,
        user_ids: Sequence[str] | None = None,
        anonymous_ids: Sequence[str] | None = None,
        contact_ids: Sequence[IdLike] | None = None,
        suppress: bool = False,
        from_: _time.TimeLike | None = None,
        to: _time.TimeLike | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        body = _erasure_body(user_ids, anonymous_ids, contact_ids, suppress, from_, to, metadata)
        acc: ErasureAccepted = await self._call(
            lambda: _create_erasure.asyncio_detailed(client=self.api, body=body), ok=202, idempotent=False
        )
        return str(acc.job_id)

    async def suppressions(
        self, *, user_id: str | None = None, anonymous_id: str | None = None, limit: int | None = None
    ) -> list[SuppressionOut]:
        lim = limit if limit is not None else UNSET
        u = user_id if user_id is not None else UNSET
        a = anonymous_id if anonymous_id is not None else UNSET
        found: SuppressionList = await self._call(
            lambda: _list_suppressions.asyncio_detailed(client=self.api, user_id=u, anonymous_id=a, limit=lim),
            ok=200,
            idempotent=True,
        )
        return list(found.suppressions)

    async def lift_suppression(
        self, *, user_id: str | None = None, anonymous_id: str | None = None
    ) -> SubjectOut:
        query = _contact_query(user_id, anonymous_id)
        lifted: SuppressionLifted = await self._call(
            lambda: _lift_suppression.asyncio_detailed(client=self.api, **query), ok=200, idempotent=True
        )
        return lifted.lifted

    async def wait(self, job_id: IdLike, *, timeout: float = 300.0, poll_interval: float = 0.5) -> JobOut:
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get_job(job_id)
            if job.status in TERMINAL_JOB_STATES:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout} s")
            await asyncio.sleep(min(poll_interval, left))

    async def stream_export(self, job_id: IdLike, *, raw: bool = False) -> AsyncIterator[Any]:
        """`async for` over the export's lines: `EventOut` models, or bytes
        with `raw=True` (see `Client.stream_export`)."""
        resp = await self._open_stream(job_id)
        try:
            rest = b""
            async for chunk in resp.aiter_bytes():
                rest += chunk
                *lines, rest = rest.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield line if raw else EventOut.from_dict(json.loads(line))
            if rest.strip():
                yield rest if raw else EventOut.from_dict(json.loads(rest))
        except httpx.TransportError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            await resp.aclose()

    async def download_export(self, job_id: IdLike, out: IO[bytes]) -> int:
        """Writes the export's NDJSON bytes to `out`; returns the byte count."""
        n = 0
        resp = await self._open_stream(job_id)
        try:
            async for chunk in resp.aiter_bytes():
                out.write(chunk)
                n += len(chunk)
        except httpx.TransportError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            await resp.aclose()
        return n

    async def _open_stream(self, job_id: IdLike) -> httpx.Response:
        hc = self.api.get_async_httpx_client()
        attempt = 0
        while True:
            try:
                resp = await hc.send(hc.build_request("GET", _job_path(job_id)), stream=True)
            except httpx.TransportError as exc:
                delay = self._policy.on_transport(exc, attempt, True)
                if delay is None:
                    raise TransportError(f"{type(exc).__name__}: {exc}") from exc
            else:
                if resp.status_code == 200:
                    return resp
                try:
                    await resp.aread()
                finally:
                    await resp.aclose()
                delay = self._policy.on_status(resp, attempt, True)
                if delay is None:
                    raise ApiError.from_response(resp.status_code, resp.headers, resp.content)
            await asyncio.sleep(delay)
            attempt += 1
