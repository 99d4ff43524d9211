"""Verify fastack webhook deliveries (Standard Webhooks). Standard library only.

fastack signs every delivery with the endpoint's secret (`whsec_...`, shown
once by `fastack admin webhook add`)::

    webhook-id: msg_...                  (the same on every retry: deduplicate on it)
    webhook-timestamp: 1764500000        (unix seconds of this attempt)
    webhook-signature: v1,<base64 HMAC-SHA256(key, id + "." + timestamp + "." + body)>
                       (several, space-separated, while a secret is being rotated)

Usage, in any web framework (`body` must be the RAW request bytes, not a
re-serialised JSON)::

    from fastack.webhooks import verify, WebhookVerificationError

    try:
        event = verify(secret, request.headers, request.body)
    except WebhookVerificationError:
        return 400
    # event is the delivery's JSON (a stored event or a job document)

`verify` RAISES `WebhookVerificationError` (a `ValueError`) when the
delivery is not genuine or is too old/new (more than 5 minutes from now),
and RETURNS the parsed JSON body when it is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Any

from ._signature import HeadersLike, SignatureError, as_text, header_lookup, parse_unix_seconds

__all__ = ["TOLERANCE_SECONDS", "WebhookVerificationError", "sign", "verify", "verify_signature"]

#: Deliveries whose timestamp is further than this from now are refused.
TOLERANCE_SECONDS = 300

WebhookVerificationError = SignatureError
"""Raised by `verify` (an alias of `fastack.SignatureError`, a ValueError)."""

_PREFIX = "whsec_"


def _key(secret: str | bytes) -> bytes:
    if isinstance(secret, (bytes, bytearray)):
        return bytes(secret)
    raw = secret.strip()
    if raw.startswith(_PREFIX):
        raw = raw[len(_PREFIX) :]
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError("a webhook secret is whsec_ followed by base64") from None


def _mac(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return hmac.new(key, signed, hashlib.sha256).digest()


def verify_signature(
    secret: str | bytes,
    headers: HeadersLike,
    body: bytes | bytearray | memoryview | str,
    *,
    tolerance: int = TOLERANCE_SECONDS,
    now: float | None = None,
) -> None:
    """Like `verify`, without parsing the body: returns None or raises."""
    key = _key(secret)
    h = header_lookup(headers)
    msg_id = as_text(h.get("webhook-id"))
    ts_text = as_text(h.get("webhook-timestamp"))
    sig_text = as_text(h.get("webhook-signature"))
    if not msg_id or not ts_text or not sig_text:
        missing = [
            n
            for n, v in (
                ("webhook-id", msg_id),
                ("webhook-timestamp", ts_text),
                ("webhook-signature", sig_text),
            )
            if not v
        ]
        raise SignatureError("missing header(s): " + ", ".join(missing))
    ts = parse_unix_seconds(ts_text, "webhook-timestamp")
    current = time.time() if now is None else now
    if abs(int(current) - ts) > tolerance:
        raise SignatureError("webhook-timestamp is more than 5 minutes from now")
    raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    expected = _mac(key, msg_id, ts, raw)
    matched = False
    for candidate in sig_text.split():
        version, _, value = candidate.partition(",")
        if version != "v1" or not value:
            continue
        try:
            got = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        # Every candidate is compared (constant time each); no early exit.
        if hmac.compare_digest(expected, got):
            matched = True
    if not matched:
        raise SignatureError("no webhook signature matches")


def verify(
    secret: str | bytes,
    headers: HeadersLike,
    body: bytes | bytearray | memoryview | str,
    *,
    tolerance: int = TOLERANCE_SECONDS,
    now: float | None = None,
) -> Any:
    """Checks a delivery and returns its parsed JSON body.

    `secret`: the endpoint's `whsec_...` (or the raw key bytes). `headers`:
    any mapping (case-insensitive lookup) or (name, value) pairs. `body`: the
    raw request bytes. Raises `WebhookVerificationError` when a header is
    missing, the timestamp is more than `tolerance` seconds (300) from now,
    or none of the `v1` signatures matches (several are accepted during a
    secret rotation; each is compared in constant time).
    """
    verify_signature(secret, headers, body, tolerance=tolerance, now=now)
    raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise SignatureError("the signed body is not JSON") from exc


def sign(secret: str | bytes, msg_id: str, timestamp: int, body: bytes | str) -> str:
    """The `webhook-signature` value fastack would send (for tests and tools)."""
    raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    return "v1," + base64.b64encode(_mac(_key(secret), msg_id, int(timestamp), raw)).decode("ascii")
