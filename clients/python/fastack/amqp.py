"""Verify fastack's AMQP messages (the x-message-signature scheme). Standard library only.

Every message fastack publishes to RabbitMQ (job and event streams) carries::

    x-message-signature: <lowercase hex HMAC-SHA256(key, signed bytes)>
    t: <unix seconds>
    signature-version: v1
    ce-tenantid: <tenant id, or "single-tenant">
    ce-subject: <job id or event id>

over the signed bytes ``t \\n v1 \\n tenant \\n subject \\n exchange \\n routing_key \\n body``.
The key is the deployment's external HMAC key: `fastack keys external-hmac`
prints it as hex (pass that hex string, or its 32 decoded bytes).

Usage with any AMQP client (pika, aio-pika, ...)::

    from fastack.amqp import verify, SignatureError

    try:
        verify(key_hex, properties.headers, body, method.exchange, method.routing_key)
    except SignatureError:
        channel.basic_nack(method.delivery_tag, requeue=False)

`verify` RETURNS None when the message is genuine and RAISES
`SignatureError` (a ValueError) otherwise: a missing header, a
signature-version other than v1, `t` more than 5 minutes from now, or a
signature that does not match (compared in constant time). Delivery is at
least once: deduplicate on the `ce-id` header.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from ._signature import HeadersLike, SignatureError, as_text, header_lookup, parse_unix_seconds

__all__ = ["SIGNATURE_VERSION", "TOLERANCE_SECONDS", "SignatureError", "key_from_hex", "sign", "verify"]

SIGNATURE_VERSION = "v1"
#: Messages whose `t` is further than this from now are refused.
TOLERANCE_SECONDS = 300


def key_from_hex(key: str | bytes) -> bytes:
    """The HMAC key: hex text (as printed by `fastack keys external-hmac`) is
    decoded; bytes are used as they are."""
    if isinstance(key, str):
        try:
            return bytes.fromhex(key.strip())
        except ValueError:
            raise SignatureError("the key is not hex (use `fastack keys external-hmac`)") from None
    return bytes(key)


def _signed(t: int, tenant: str, subject: str, exchange: str, routing_key: str, body: bytes) -> bytes:
    head = f"{t}\n{SIGNATURE_VERSION}\n{tenant}\n{subject}\n{exchange}\n{routing_key}\n"
    return head.encode("utf-8") + body


def sign(
    key: str | bytes,
    t: int,
    tenant: str,
    subject: str,
    exchange: str,
    routing_key: str,
    body: bytes,
) -> str:
    """The `x-message-signature` fastack would put on such a message."""
    msg = _signed(int(t), tenant, subject, exchange, routing_key, bytes(body))
    return hmac.new(key_from_hex(key), msg, hashlib.sha256).hexdigest()


def verify(
    key: str | bytes,
    headers: HeadersLike,
    body: bytes | bytearray | memoryview,
    exchange: str,
    routing_key: str,
    *,
    tolerance: int = TOLERANCE_SECONDS,
    now: float | None = None,
) -> None:
    """Checks one message; returns None or raises `SignatureError`.

    `key`: hex text or raw bytes. `headers`: the message's headers table
    (values may be str, bytes or int). `body`: the raw message body.
    `exchange` / `routing_key`: as delivered (e.g. `method.exchange`,
    `method.routing_key` in pika).
    """
    raw_key = key_from_hex(key)
    h = header_lookup(headers)

    def get(name: str) -> str:
        value = as_text(h.get(name))
        if value is None:
            raise SignatureError(f"missing header {name}")
        return value

    if get("signature-version") != SIGNATURE_VERSION:
        raise SignatureError("unsupported signature-version")
    t = parse_unix_seconds(get("t"), "t")
    current = time.time() if now is None else now
    if abs(int(current) - t) > tolerance:
        raise SignatureError("signature timestamp is more than 5 minutes from now")
    tenant = get("ce-tenantid")
    subject = get("ce-subject")
    signature = get("x-message-signature").strip()
    try:
        given = bytes.fromhex(signature)
    except ValueError:
        raise SignatureError("x-message-signature is not hex") from None
    expected = hmac.new(
        raw_key, _signed(t, tenant, subject, exchange, routing_key, bytes(body)), hashlib.sha256
    ).digest()
    if not hmac.compare_digest(expected, given):
        raise SignatureError("signature does not match")
