"""The exceptions of the SDK (standard library only)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ApiError",
    "EventTooLarge",
    "FastackError",
    "Forbidden",
    "ProblemField",
    "QueueFull",
    "TrackerClosed",
    "TrackerError",
    "TransportError",
    "Unauthorized",
    "Undelivered",
]


class FastackError(Exception):
    """Base class of every error this SDK raises or reports.

    `kind` names the failure in a word: `unauthorized` (401), `forbidden`
    (403), `rejected` (another refusal), `unavailable` (408, 429, 5xx),
    `unreachable` (no answer), `too_large`, `dropped`, `closed`,
    `undelivered` (the TypeScript SDK's `TrackerError.kind` uses the same
    words where it has the same case)."""

    kind: str = "error"


@dataclass(frozen=True)
class ProblemField:
    """One entry of a problem's `errors`: which field, why.

    `field` is a JSON pointer into the request body (`/user_id`,
    `/batch/3/occurred_at`, `""` for the body itself) or a query parameter's
    name (`from`); `index` is the batch item, when the request was a batch.
    Also readable as a mapping: `err["field"]`.
    """

    field: str
    code: str
    message: str
    index: int | None = None

    def __getitem__(self, key: str) -> Any:
        if key not in ("field", "code", "message", "index"):
            raise KeyError(key)
        return getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "code": self.code, "message": self.message}
        if self.index is not None:
            out["index"] = self.index
        return out


@dataclass(eq=False)
class ApiError(FastackError):
    """The server answered with an error: an RFC 9457 problem document.

    `status` is the HTTP status, `code` the stable machine-readable code
    (`invalid_payload`, `idempotency_key_conflict`, `rate_limited`, ... — the
    OpenAPI `ProblemCode` enum), `detail` the human explanation and `errors`
    the offending fields. An answer that is not a problem document (a proxy's
    HTML page, say) still becomes an `ApiError`, with `code`
    `"unexpected_response"` and the start of the body as `detail`.
    """

    status: int
    code: str
    detail: str
    errors: list[ProblemField] = field(default_factory=list)
    title: str = ""
    type: str = ""
    retry_after: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    body: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        Exception.__init__(self, self.status, self.code, self.detail)

    def __str__(self) -> str:
        text = f"{self.status} {self.code}: {self.detail}"
        if self.errors:
            text += " [" + "; ".join(f"{e.field or '(body)'}: {e.code}" for e in self.errors) + "]"
        return text

    @property
    def retryable(self) -> bool:
        """429 and 5xx: nothing was accepted, the same request may be sent again."""
        return self.status == 429 or self.status >= 500

    @property
    def kind(self) -> str:  # type: ignore[override]
        """`unauthorized` (401), `forbidden` (403), `unavailable` (408, 429,
        5xx: worth retrying) or `rejected`."""
        if self.status == 401:
            return "unauthorized"
        if self.status == 403:
            return "forbidden"
        if self.status in (408, 429) or self.status >= 500:
            return "unavailable"
        return "rejected"

    @classmethod
    def from_response(cls, status: int, headers: Mapping[str, str], body: bytes) -> ApiError:
        """Builds the error from a non-2xx answer (any body): an
        `Unauthorized` for a 401, a `Forbidden` for a 403 (both `ApiError`s)."""
        if cls is ApiError:
            cls = _BY_STATUS.get(status, ApiError)
        retry_after = parse_retry_after(headers.get("retry-after"))
        doc: Any = None
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("code"), str):
            errors = []
            for raw in doc.get("errors") or []:
                if not isinstance(raw, dict):
                    continue
                index = raw.get("index")
                errors.append(
                    ProblemField(
                        field=str(raw.get("field", "")),
                        code=str(raw.get("code", "")),
                        message=str(raw.get("message", "")),
                        index=index if isinstance(index, int) else None,
                    )
                )
            return cls(
                status=int(doc.get("status") or status),
                code=doc["code"],
                detail=str(doc.get("detail", "")),
                errors=errors,
                title=str(doc.get("title", "")),
                type=str(doc.get("type", "")),
                retry_after=retry_after,
                headers=dict(headers),
                body=body,
            )
        text = body[:500].decode("utf-8", errors="replace")
        return cls(
            status=status,
            code="unexpected_response",
            detail=text or f"HTTP {status} without a problem document",
            retry_after=retry_after,
            headers=dict(headers),
            body=body,
        )


class Unauthorized(ApiError):
    """A `401`: the API key is missing, unknown or revoked. Not transient: a
    Tracker that gets one stops sending (see the README)."""


class Forbidden(ApiError):
    """A `403`: the key may not do this. Not transient, like `Unauthorized`."""


_BY_STATUS: dict[int, type[ApiError]] = {401: Unauthorized, 403: Forbidden}


class TransportError(FastackError):
    """The request did not get an answer (connection refused or reset, timeout).

    The underlying exception (httpx's) is `__cause__`.
    """

    kind = "unreachable"


class EventTooLarge(FastackError):
    """Reported by the Tracker (via `on_error`) for an item whose JSON is over
    the server's 32 KiB per-event limit: it could never be accepted."""

    kind = "too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"event is {size} bytes of JSON; the limit is {limit}")
        self.size = size
        self.limit = limit


class QueueFull(FastackError):
    """Reported by the Tracker (via `on_error`) for an item dropped because its
    queue held `max_queue_size` items. `dropped` is the running total."""

    kind = "dropped"

    def __init__(self, dropped: int) -> None:
        super().__init__(f"tracker queue full: item dropped ({dropped} dropped so far)")
        self.dropped = dropped


class TrackerClosed(FastackError):
    """Reported by the Tracker (via `on_error`) for items that were not
    delivered: tracked after `close()` (this class), or still queued or
    retrying when `close()` (or the exit handler) ran out of time without a
    spool (`Undelivered`, a subclass)."""

    kind = "closed"


class Undelivered(TrackerClosed):
    """Reported by the Tracker (via `on_error`) for items still queued or
    retrying when `close()` (or the exit handler) reached its deadline, when
    no spool is configured. The server may have stored one that was in
    flight: resending them with the same idempotency keys is safe."""

    kind = "undelivered"


class TrackerError(FastackError):
    """Raised by `Tracker.flush(raise_on_error=True)` /
    `Tracker.close(raise_on_error=True)` when not everything was delivered.

    `result` is the call's `FlushResult`; `error` the most serious failure
    behind it (an `Unauthorized` / `Forbidden` first; also `__cause__`);
    `kind`, `status` and `code` are that error's (`status`/`code` are None
    when it was not an answer of the server, e.g. a deadline)."""

    def __init__(self, message: str, result: Any, error: FastackError | None) -> None:
        super().__init__(message)
        self.result = result
        self.error = error
        self.kind = error.kind if error is not None else "undelivered"
        self.status: int | None = error.status if isinstance(error, ApiError) else None
        self.code: str | None = error.code if isinstance(error, ApiError) else None


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        import time
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)
