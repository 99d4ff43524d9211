"""Retry policy shared by the clients and the Tracker (standard library only)."""

from __future__ import annotations

import random

#: First backoff step and cap, in seconds.
BACKOFF_BASE = 0.1
BACKOFF_MAX = 10.0


def backoff(attempt: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_MAX) -> float:
    """Capped exponential backoff with jitter: attempt 0 waits 0.05–0.1 s,
    then 0.1–0.2 s, ... up to cap/2–cap ("equal jitter": never less than half
    the step, so retries of many clients spread out without hammering)."""
    step = min(cap, base * float(1 << min(attempt, 30)))
    return step / 2 + random.uniform(0, step / 2)


def retry_delay(
    status: int | None,
    retry_after: float | None,
    attempt: int,
    base: float = BACKOFF_BASE,
    cap: float = BACKOFF_MAX,
) -> float:
    """How long to wait before the next attempt. A 429/503 with `Retry-After`
    waits at least that long (plus up to 10 % jitter, so a crowd of clients
    does not come back in the same millisecond); anything else backs off."""
    if retry_after is not None and status in (429, 503):
        return retry_after + random.uniform(0, max(0.05, retry_after * 0.1))
    return backoff(attempt, base, cap)
