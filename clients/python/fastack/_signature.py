"""Shared by fastack.webhooks and fastack.amqp (standard library only)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Union

HeadersLike = Union[Mapping[str, Any], Iterable[tuple[str, Any]]]


class SignatureError(ValueError):
    """A message failed verification: bad or missing signature headers, a
    timestamp outside the tolerance, or no signature that matches.

    Subclass of ValueError; the message says which check failed (never
    anything secret)."""


def header_lookup(headers: HeadersLike) -> dict[str, Any]:
    """Lower-cased header names -> values, from a mapping (dict,
    `email.message.Message`, a framework's header object) or (name, value)
    pairs. With repeated names the first wins."""
    items: Iterable[tuple[str, Any]]
    if isinstance(headers, Mapping):
        items = headers.items()
    elif hasattr(headers, "items"):
        items = headers.items()
    else:
        items = headers
    out: dict[str, Any] = {}
    for name, value in items:
        key = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        out.setdefault(key.lower(), value)
    return out


def as_text(value: Any) -> str | None:
    """A header value as text: str, bytes (UTF-8, invalid bytes replaced, as
    the server reads AMQP headers) or an integer."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def parse_unix_seconds(text: str, name: str) -> int:
    text = text.strip()
    body = text[1:] if text[:1] in "+-" else text
    if not body.isdigit() or not body.isascii():
        raise SignatureError(f"{name} is not a number of seconds")
    return int(text)
