"""Schemathesis hooks for fastack's contract test: timestamps inside the
window the server accepts (now, within the retention), so generated events
reach the accept path instead of stopping at the time check. Everything
else stays as generated."""
from datetime import datetime, timedelta, timezone

import schemathesis

INGEST = {"/v1/core/track", "/v1/core/identify", "/v1/core/batch"}


def _recent() -> str:
    return (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat()


@schemathesis.hook
def map_body(ctx, body):
    path = ctx.operation.path if ctx.operation else ""
    if path not in INGEST or not isinstance(body, dict):
        return body
    items = body.get("batch") if path == "/v1/core/batch" else [body]
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and "occurred_at" in item:
            item["occurred_at"] = _recent()
    return body


@schemathesis.hook
def map_query(ctx, query):
    path = ctx.operation.path if ctx.operation else ""
    if path == "/v1/core/events" and isinstance(query, dict):
        now = datetime.now(timezone.utc)
        query["from"] = (now - timedelta(days=1)).isoformat()
        query["to"] = (now + timedelta(days=1)).isoformat()
    return query
