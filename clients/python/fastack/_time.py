"""RFC 3339 timestamps with an offset (standard library only)."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Union

TimeLike = Union[_dt.datetime, str]

_RFC3339 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def now() -> str:
    """Now, in the local offset: `2026-11-30T10:15:00.123456+01:00`."""
    return _dt.datetime.now().astimezone().isoformat()


def aware(value: _dt.datetime) -> _dt.datetime:
    """A naive datetime is local time (Python's convention): give it the local offset."""
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        return value.astimezone()
    return value


def format_time(value: TimeLike) -> str:
    """RFC 3339 with an offset. Strings are passed through untouched (the
    server validates them and keeps what was sent)."""
    if isinstance(value, str):
        return value
    if isinstance(value, _dt.datetime):
        return aware(value).isoformat()
    raise TypeError(f"expected a datetime or an RFC 3339 string, got {type(value).__name__}")


def parse_time(value: TimeLike) -> _dt.datetime:
    """An aware datetime from a datetime or an RFC 3339 string (also on
    Python 3.9/3.10, whose `fromisoformat` refuses `Z`). A leap second
    (`23:59:60`) reads as the last microsecond before it, as the server does."""
    if isinstance(value, _dt.datetime):
        return aware(value)
    if not isinstance(value, str):
        raise TypeError(f"expected a datetime or an RFC 3339 string, got {type(value).__name__}")
    m = _RFC3339.match(value.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 timestamp with an offset: {value!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac = m.group(7)
    micro = int((frac[1:] + "000000")[:6]) if frac else 0
    if second == 60:
        second, micro = 59, 999_999
    off = m.group(8)
    if off in ("Z", "z"):
        tz = _dt.timezone.utc
    else:
        sign = -1 if off[0] == "-" else 1
        tz = _dt.timezone(sign * _dt.timedelta(hours=int(off[1:3]), minutes=int(off[4:6])))
    return _dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
