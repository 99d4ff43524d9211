"""Schemathesis hooks for fastack's contract test: timestamps inside the
window the server accepts (now, within the retention), so generated events
reach the accept path instead of stopping at the time check. Everything
else stays as generated."""
from datetime import datetime, timedelta, timezone

import schemathesis

INGEST = {"/v1/core/track", "/v1/core/identify", "/v1/core/batch"}


def _recent() -> str:
    return (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat()


WINDOWED = {"/v1/core/exports", "/v1/core/erasures"}


def _instant(value) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


@schemathesis.hook
def map_body(ctx, body):
    path = ctx.operation.path if ctx.operation else ""
    if path in WINDOWED and isinstance(body, dict):
        # A valid window (`to` after `from`), so a request reaches the rules
        # after it; a window that is itself the invalid part stays as it is.
        if _instant(body.get("from")) and _instant(body.get("to")):
            now = datetime.now(timezone.utc)
            body["from"] = (now - timedelta(days=1)).isoformat()
            body["to"] = now.isoformat()
        return body
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


# --- schema-valid requests are accepted ------------------------------------
#
# A request the document says is valid may be refused only for a rule a
# schema cannot say (one that crosses fields, or a cursor's validity), and
# only when the operation says so in its description, its parameters' or
# its request body's. Each such rule: the
# refusal's message, and the words its operation's text must hold.
import json
import re
from pathlib import Path

CROSS_FIELD_RULES = [
    (r"`to` must be after `from`", "`to` must be after `from`"),
    (r"older than the tenant's retention", "inside the tenant's retention"),
    (r"more than 24 h in the future|in the future", "24 h in the future"),
    (r"give exactly one of `user_id` or `anonymous_id`", "exactly one of `user_id` or `anonymous_id`"),
    (
        r"give at most one of `contact_id`, `user_id` or `anonymous_id`",
        "at most one of `contact_id`,\n`user_id` or `anonymous_id`",
    ),
    (r"name at least one person", "at least one person"),
    (r"NUL \(\\u0000\) is not allowed", "holds NUL"),
    (r"lone UTF-16 surrogate", "lone surrogate"),
    (r"cannot be stored exactly", "storable exactly"),
    (r"must not contain control characters", "no control characters"),
    (r"`cursor` is not a cursor returned by this endpoint", "only a `next_cursor` this endpoint returned"),
    (r"one of `user_id` or `anonymous_id` is required|`user_id` or `anonymous_id` is required",
     "one of `user_id` / `anonymous_id` is required"),
]
ACCEPTED = {401, 403, 404, 409, 429}
SPEC = json.loads((Path(__file__).resolve().parents[2] / "openapi/openapi.json").read_text())


def _resolve(schema: dict) -> dict:
    ref = schema.get("$ref", "")
    return SPEC["components"]["schemas"][ref.rsplit("/", 1)[-1]] if ref else schema


def _descriptions(schema: dict, seen: set[int] | None = None) -> list[str]:
    """Every description in a schema and the schemas it reaches."""
    seen = set() if seen is None else seen
    schema = _resolve(schema)
    if id(schema) in seen:
        return []
    seen.add(id(schema))
    out = [schema.get("description", "")]
    for sub in schema.get("oneOf", []) + schema.get("allOf", []) + schema.get("anyOf", []):
        out += _descriptions(sub, seen)
    for sub in schema.get("properties", {}).values():
        out += _descriptions(sub, seen)
    if isinstance(schema.get("items"), dict):
        out += _descriptions(schema["items"], seen)
    return out


def _texts(method: str, path: str) -> str:
    """The operation's summary and description, its parameters' and its
    request body's."""
    op = SPEC["paths"].get(path, {}).get(method.lower(), {})
    texts = [op.get("summary", ""), op.get("description", "")]
    texts += [p.get("description", "") for p in op.get("parameters", [])]
    for media in op.get("requestBody", {}).get("content", {}).values():
        texts += _descriptions(media.get("schema", {}))
    return "\n".join(texts)


def _unknown_member(value, schema: dict) -> bool:
    """Whether `value` holds a member its schema closes out
    (`additionalProperties: false`): such a request is not schema-valid,
    whatever the generator labelled it."""
    schema = _resolve(schema)
    if "oneOf" in schema:
        return all(_unknown_member(value, s) for s in schema["oneOf"])
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return True
        return any(_unknown_member(v, props[k]) for k, v in value.items() if k in props)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return any(_unknown_member(v, schema["items"]) for v in value)
    return False


def _body_schema(method: str, path: str) -> dict:
    op = SPEC["paths"].get(path, {}).get(method.lower(), {})
    media = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    return media.get("schema", {})


def _documented(message: str, texts: str) -> bool:
    """Whether the message is a listed rule whose words the operation's
    text holds (case and line breaks aside)."""
    squashed = " ".join(texts.split()).lower()
    for pattern, words in CROSS_FIELD_RULES:
        if re.search(pattern, message):
            return " ".join(words.split()).lower() in squashed
    return False


@schemathesis.check
def valid_data_is_accepted(ctx, response, case):
    """A schema-valid request is accepted, or refused only for a cross-field
    rule its operation documents."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    status = response.status_code
    if status < 400 or status >= 500 or status in ACCEPTED:
        return None
    if case.body is not None and _unknown_member(case.body, _body_schema(case.operation.method, case.operation.path)):
        return None
    try:
        problem = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"schema-valid request refused with {status} and no problem document")
    messages = [e.get("message", "") for e in problem.get("errors") or []] or [problem.get("detail", "")]
    texts = _texts(case.operation.method, case.operation.path)
    undocumented = [m for m in messages if not _documented(m, texts)]
    if undocumented:
        raise AssertionError(
            f"schema-valid request refused ({status} {problem.get('code')}) for what the document "
            f"does not say: {undocumented}"
        )
    return None
