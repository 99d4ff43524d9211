"""fastack.webhooks.verify against real deliveries, fastack.amqp.verify
against messages signed by the documented scheme with the deployment key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import queue
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from fastack import Client, SignatureError, Tracker, amqp, webhooks
from fastack.webhooks import WebhookVerificationError, verify

from .conftest import Server, python_env


class Receiver:
    """A local webhook endpoint that keeps each delivery's raw headers and body."""

    def __init__(self) -> None:
        self.deliveries: queue.Queue[tuple[list[tuple[str, str]], bytes]] = queue.Queue()
        got = self.deliveries

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                got.put((list(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_webhook_verify_accepts_a_real_delivery_and_refuses_tampering(server_factory: Any) -> None:
    allow = {"FASTACK_WEBHOOK_ALLOW_PRIVATE": "true"}
    server: Server = server_factory(env=allow)
    receiver = Receiver()
    try:
        endpoint = server.admin(
            "webhook", "add", "--tenant", "default", "--url", receiver.url, "--events", "core.event.tracked"
        )
        secret = endpoint["secret"]
        assert secret.startswith("whsec_")
        with Client(server.bootstrap_key, base_url=server.base_url) as client:
            ack = client.track("Hooked", user_id="u-1", properties={"amount": 9.99, "note": "naïve ☃"})
        headers, body = receiver.deliveries.get(timeout=30)
    finally:
        receiver.close()

    names = {k.lower() for k, _ in headers}
    assert {"webhook-id", "webhook-timestamp", "webhook-signature", "webhook-event"} <= names

    # Genuine: returns the parsed body (the stored event).
    event = verify(secret, headers, body)
    assert event["id"] == str(ack.id) and event["event"] == "Hooked"
    assert event["properties"]["note"] == "naïve ☃"
    # Also with a plain dict of any case, and with the raw key bytes.
    as_dict = {k.upper(): v for k, v in headers}
    assert verify(secret, as_dict, body)["id"] == str(ack.id)
    webhooks.verify_signature(base64.b64decode(secret[len("whsec_") :]), as_dict, body)

    # During a rotation several signatures are sent: any one matching is enough.
    sig = dict((k.lower(), v) for k, v in headers)["webhook-signature"]
    rotated = {**dict(headers), "webhook-signature": f"v1,{base64.b64encode(b'0' * 32).decode()} {sig}"}
    assert verify(secret, rotated, body)["id"] == str(ack.id)

    # Tampered body, other secret, a signature of another version: refused.
    with pytest.raises(WebhookVerificationError):
        verify(secret, headers, body.replace(b"9.99", b"0.01"))
    with pytest.raises(WebhookVerificationError):
        verify(secret, headers, body + b" ")
    other = "whsec_" + base64.b64encode(b"k" * 32).decode()
    with pytest.raises(WebhookVerificationError):
        verify(other, headers, body)
    with pytest.raises(WebhookVerificationError):
        verify(secret, {**dict(headers), "webhook-signature": sig.replace("v1,", "v2,")}, body)
    # The id and timestamp are signed too.
    with pytest.raises(WebhookVerificationError):
        verify(secret, {**dict(headers), "webhook-id": "msg_other"}, body)

    # An old delivery (or a replay of this one much later) is refused, even
    # with a valid signature: more than 5 minutes from now.
    ts = int(dict((k.lower(), v) for k, v in headers)["webhook-timestamp"])
    with pytest.raises(WebhookVerificationError, match="5 minutes"):
        verify(secret, headers, body, now=ts + 301)
    assert verify(secret, headers, body, now=ts + 299)["id"] == str(ack.id)
    old_ts = ts - 600
    msg_id = dict((k.lower(), v) for k, v in headers)["webhook-id"]
    old = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(old_ts),
        "webhook-signature": webhooks.sign(secret, msg_id, old_ts, body),
    }
    with pytest.raises(WebhookVerificationError, match="5 minutes"):
        verify(secret, old, body)
    # The same signature scheme, fresh: accepted (sign() matches the server's).
    fresh_ts = int(time.time())
    fresh = {
        **old,
        "webhook-timestamp": str(fresh_ts),
        "webhook-signature": webhooks.sign(secret, msg_id, fresh_ts, body),
    }
    assert verify(secret, fresh, body)["id"] == str(ack.id)


def test_webhook_verify_refuses_malformed_input() -> None:
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    body = b'{"a":1}'
    now = int(time.time())
    good = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(now),
        "webhook-signature": webhooks.sign(secret, "msg_1", now, body),
    }
    assert verify(secret, good, body) == {"a": 1}
    assert verify(secret, list(good.items()), body.decode()) == {"a": 1}
    for missing in good:
        with pytest.raises(SignatureError, match="missing"):
            verify(secret, {k: v for k, v in good.items() if k != missing}, body)
    for bad_ts in ("soon", "", "1.5", "١٢٣"):
        with pytest.raises(SignatureError):
            verify(secret, {**good, "webhook-timestamp": bad_ts}, body)
    for bad_sig in ("v1,", "v1,!!!", "garbage", "v1a," + good["webhook-signature"][3:]):
        with pytest.raises(SignatureError):
            verify(secret, {**good, "webhook-signature": bad_sig}, body)
    with pytest.raises(SignatureError):
        verify("whsec_***", good, body)
    assert issubclass(WebhookVerificationError, ValueError)


def key_of(server: Server) -> str:
    return server.cli("keys", "external-hmac").strip()


def reference_signature(
    key_hex: str, t: int, tenant: str, subject: str, exchange: str, rk: str, body: bytes
) -> str:
    """The scheme as documented, written out independently of the SDK."""
    signed = f"{t}\nv1\n{tenant}\n{subject}\n{exchange}\n{rk}\n".encode() + body
    return hmac.new(bytes.fromhex(key_hex), signed, hashlib.sha256).hexdigest()


def test_amqp_verify_with_the_deployment_key(server: Server) -> None:
    key_hex = key_of(server)
    assert len(key_hex) == 64 and bytes.fromhex(key_hex)
    assert key_hex != server.cli("keys", "external-hmac", "--tenant", "default").strip()

    t = int(time.time())
    tenant, subject = "01a22f86-2430-7188-97a6-73a245490d02", "01a22f86-4066-7748-b15e-ded1aa00ecc9"
    exchange, rk = "fastack.core.events", "core.event.tracked"
    body = json.dumps({"id": subject, "event": "Signed Up", "note": "ünïcode"}).encode()
    sig = reference_signature(key_hex, t, tenant, subject, exchange, rk, body)
    headers: dict[str, Any] = {
        "x-message-signature": sig,
        "t": str(t),
        "signature-version": "v1",
        "ce-tenantid": tenant,
        "ce-subject": subject,
        "ce-id": f"fastack.event.tracked.{subject}",
    }
    assert amqp.sign(key_hex, t, tenant, subject, exchange, rk, body) == sig
    amqp.verify(key_hex, headers, body, exchange, rk)  # returns None
    amqp.verify(bytes.fromhex(key_hex), headers, body, exchange, rk)
    # As AMQP clients deliver header values: bytes (long strings), an int t.
    amqp.verify(key_hex, {k: v.encode() for k, v in headers.items()}, body, exchange, rk)
    amqp.verify(key_hex, {**headers, "t": t}, body, exchange, rk)
    amqp.verify(key_hex, {**headers, "x-message-signature": sig.upper()}, body, exchange, rk)

    def refused(match: str, **changes: Any) -> None:
        args: dict[str, Any] = {
            "key": key_hex,
            "headers": headers,
            "body": body,
            "exchange": exchange,
            "routing_key": rk,
        }
        args.update(changes)
        with pytest.raises(SignatureError, match=match):
            amqp.verify(
                args.pop("key"),
                args.pop("headers"),
                args.pop("body"),
                args.pop("exchange"),
                args.pop("routing_key"),
                **args,
            )

    refused("does not match", body=body + b" ")
    refused("does not match", exchange="fastack.job.events")
    refused("does not match", routing_key="job.completed")
    refused("does not match", headers={**headers, "ce-subject": "another"})
    refused("does not match", headers={**headers, "ce-tenantid": "single-tenant"})
    refused("does not match", key="00" * 32)
    refused("signature-version", headers={**headers, "signature-version": "v2"})
    refused("5 minutes", now=t + 301)
    refused("5 minutes", now=t - 301)
    refused("not hex", headers={**headers, "x-message-signature": "zz"})
    for name in ("x-message-signature", "t", "signature-version", "ce-tenantid", "ce-subject"):
        refused(f"missing header {name}", headers={k: v for k, v in headers.items() if k != name})
    # A message signed five minutes ago (t from then): refused now.
    old_t = t - 400
    old = {
        **headers,
        "t": str(old_t),
        "x-message-signature": reference_signature(key_hex, old_t, tenant, subject, exchange, rk, body),
    }
    refused("5 minutes", headers=old)
    amqp.verify(key_hex, old, body, exchange, rk, now=old_t + 10)


def test_signature_modules_need_only_the_standard_library() -> None:
    code = (
        "import sys; import fastack.webhooks, fastack.amqp; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('httpx', 'attrs', 'httpcore', 'anyio')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_tracker_events_reach_a_webhook(server_factory: Any) -> None:
    """End to end: Tracker -> server -> signed delivery -> verify."""
    server: Server = server_factory(env={"FASTACK_WEBHOOK_ALLOW_PRIVATE": "true"})
    receiver = Receiver()
    try:
        secret = server.admin(
            "webhook", "add", "--tenant", "default", "--url", receiver.url, "--events", "core.event.tracked"
        )["secret"]
        with Tracker(server.bootstrap_key, base_url=server.base_url) as tracker:
            keys = [tracker.track("Hook", user_id="u", properties={"seq": i}) for i in range(3)]
        assert len(keys) == 3
        got = sorted(
            verify(secret, *receiver.deliveries.get(timeout=30))["properties"]["seq"] for _ in range(3)
        )
        assert got == [0, 1, 2]
    finally:
        receiver.close()
