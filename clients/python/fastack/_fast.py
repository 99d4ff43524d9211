"""The Tracker's per-event hot path: a timestamp, a key, JSON (standard library only).

Each is a few times cheaper than the obvious stdlib call (measured in
benches/scripts/sdk-python.py): `track()` runs in the application's thread.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable

__all__ = ["dumps", "new_key", "now"]


# --- now(): RFC 3339 with the local offset, microseconds ----------------------
# The date-time up to the second and the offset are formatted once per second
# (the offset can change only with the wall clock, e.g. at a DST switch).
_second_cache: tuple[int, str, str] = (-1, "", "")


def _format_second(sec: int) -> tuple[int, str, str]:
    lt = time.localtime(sec)
    off = lt.tm_gmtoff or 0
    sign = "+" if off >= 0 else "-"
    off = abs(off)
    zone = f"{sign}{off // 3600:02d}:{off % 3600 // 60:02d}"
    return (sec, time.strftime("%Y-%m-%dT%H:%M:%S", lt), zone)


def now() -> str:
    """Now with the local offset: `2026-11-30T10:15:00.123456+01:00`."""
    global _second_cache
    sec, ns = divmod(time.time_ns(), 1_000_000_000)
    cache = _second_cache
    if cache[0] != sec:
        cache = _second_cache = _format_second(sec)
    return f"{cache[1]}.{ns // 1000:06d}{cache[2]}"


# --- new_key(): a time-ordered random UUID (version 7, RFC 9562) ------------
# 48 bits of unix milliseconds, then 74 random bits. Keys made close in time
# sort close together, so the server's unique index on idempotency keys is
# appended to rather than written all over: measured on the embedded SQLite
# store, random UUID4 keys cost the server about a third of its batch
# throughput (benches/scripts/sdk-python.py). Still unique: 74 random bits per
# millisecond.
#
# Random bytes are read 20 KiB at a time (one syscall per 2,048 keys) into a
# per-thread pool. After a fork the child must not reuse the parent's pool
# (the same keys twice would collide): the epoch invalidates every pool.
_local = threading.local()
_epoch = 0
_POOL_KEYS = 2048
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def _new_epoch() -> None:
    global _epoch
    _epoch += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_epoch)


def new_key() -> str:
    """A random, time-ordered UUID (version 7) string."""
    loc = _local
    pos = getattr(loc, "pos", 0)
    pool: str = getattr(loc, "pool", "")
    if pos >= len(pool) or getattr(loc, "epoch", -1) != _epoch:
        pool = loc.pool = os.urandom(10 * _POOL_KEYS).hex()
        loc.epoch = _epoch
        pos = 0
    loc.pos = pos + 20
    r = pool[pos : pos + 20]
    t = f"{time.time_ns() // 1_000_000:012x}"
    return f"{t[:8]}-{t[8:]}-7{r[:3]}-{_VARIANT[r[3]]}{r[4:7]}-{r[8:]}"


# --- dumps(): compact JSON, UTF-8 kept, NaN/Infinity refused ------------------
def _refuse(o: Any) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _make_dumps() -> Callable[[Any], str]:
    fallback = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    try:
        from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]

        if c_make_encoder is None:
            return fallback
        # The C encoder json.dumps builds on every call, built once. No
        # circular-reference markers: a cycle ends in RecursionError.
        enc = c_make_encoder(None, _refuse, encode_basestring, None, ":", ",", False, False, False)
        join = "".join

        def dumps(o: Any) -> str:
            return join(enc(o, 0))

        if dumps({"a": [1, 2.5, "é", None, True]}) != '{"a":[1,2.5,"é",null,true]}':
            return fallback
        return dumps
    except Exception:
        return fallback


dumps = _make_dumps()
