"""Client and AsyncClient against a real server."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import io
import json
import uuid
from contextlib import closing
from typing import Any

import pytest

from fastack import ApiError, AsyncClient, Client, TransportError
from fastack.models import UNSET, EventOut

from .conftest import Server, free_port, wait_for, window


def all_events(client: Client, **kw: object) -> list[EventOut]:
    frm, to = window()
    return list(client.events(frm, to, **kw))  # type: ignore[arg-type]


def test_track_identify_batch_round_trip(server: Server, api_key: str) -> None:
    with Client(api_key, base_url=server.base_url) as client:
        t = client.track(
            "Signed Up",
            user_id="u-1",
            properties={"plan": "pro", "amount": 12.5, "tags": ["a", "b"], "nested": {"x": 1}},
            # A string is sent as it is (offset kept).
            occurred_at=dt.datetime.now(dt.timezone(dt.timedelta(hours=1))).isoformat(timespec="seconds"),
            idempotency_key="signup-u-1",
        )
        assert t.duplicate is False
        i = client.identify(user_id="u-1", anonymous_id="anon-1", traits={"email": "a@example.com"})
        acks = client.batch(
            [
                {"type": "track", "event": "Viewed", "anonymous_id": "anon-1", "properties": {"page": "/"}},
                {"type": "identify", "user_id": "u-2", "traits": {"name": "Zoë"}},
                {"type": "track", "event": "Bought", "user_id": "u-2", "idempotency_key": "buy-u-2"},
            ]
        )
        assert len(acks) == 3 and all(a.duplicate is False for a in acks)
        expected = {str(t.id), str(i.id), *(str(a.id) for a in acks)}

        events = wait_for(lambda: (evs := all_events(client)) and len(evs) >= 5 and evs, what="5 events")
        by_id = {str(e.id): e for e in events}
        assert set(by_id) == expected
        signup = by_id[str(t.id)]
        assert signup.event == "Signed Up" and signup.user_id == "u-1"
        assert signup.occurred_at.utcoffset() == dt.timedelta(hours=1)  # the sender's offset is kept
        assert signup.properties.to_dict() == {
            "plan": "pro",
            "amount": 12.5,
            "tags": ["a", "b"],
            "nested": {"x": 1},
        }
        ident = by_id[str(i.id)]
        assert ident.type_ == "identify" and ident.event is UNSET
        assert ident.traits.to_dict() == {"email": "a@example.com"}
        assert by_id[str(acks[1].id)].traits["name"] == "Zoë"

        # The identify linked anon-1 to u-1: one contact, found either way.
        c1 = client.find_contact(user_id="u-1")
        assert client.find_contact(anonymous_id="anon-1").id == c1.id
        assert "anon-1" in c1.anonymous_ids and c1.traits["email"] == "a@example.com"
        assert client.get_contact(c1.id).user_ids == ["u-1"]
        only_c1 = all_events(client, contact_id=c1.id)
        assert {str(e.id) for e in only_c1} == {str(t.id), str(i.id), str(acks[0].id)}
        # The same person by either identifier.
        assert {str(e.id) for e in all_events(client, user_id="u-1")} == {str(t.id), str(i.id), str(acks[0].id)}
        assert {str(e.id) for e in all_events(client, anonymous_id="anon-1")} == {str(t.id), str(i.id), str(acks[0].id)}
        with pytest.raises(ValueError):
            all_events(client, user_id="u-1", anonymous_id="anon-1")
        assert [e.event for e in all_events(client, event="Bought")] == ["Bought"]


def test_duplicate_answers_the_same_id(server: Server, api_key: str) -> None:
    with Client(api_key, base_url=server.base_url) as client:
        when = dt.datetime.now().astimezone()
        first = client.track(
            "Paid", user_id="u-9", properties={"n": 1}, occurred_at=when, idempotency_key="pay-1"
        )
        again = client.track(
            "Paid", user_id="u-9", properties={"n": 1}, occurred_at=when, idempotency_key="pay-1"
        )
        assert first.duplicate is False and again.duplicate is True
        assert again.id == first.id
        # sent_at is not part of the comparison.
        third = client.track(
            "Paid",
            user_id="u-9",
            properties={"n": 1},
            occurred_at=when,
            idempotency_key="pay-1",
            sent_at=when,
        )
        assert third.id == first.id and third.duplicate is True
        # In a batch too, and the same instant in another offset is the same content.
        acks = client.batch(
            [
                {
                    "type": "track",
                    "event": "Paid",
                    "user_id": "u-9",
                    "properties": {"n": 1},
                    "occurred_at": when.astimezone(dt.timezone(dt.timedelta(hours=-5))),
                    "idempotency_key": "pay-1",
                }
            ]
        )
        assert acks[0].id == first.id and acks[0].duplicate is True


def test_conflict_and_validation_errors_are_api_errors(server: Server, api_key: str) -> None:
    with Client(api_key, base_url=server.base_url) as client:
        client.track("A", user_id="u", idempotency_key="k-1")
        with pytest.raises(ApiError) as info:
            client.track("B", user_id="u", idempotency_key="k-1")
        e = info.value
        assert (e.status, e.code) == (409, "idempotency_key_conflict")
        assert e.errors[0].field == "/idempotency_key" and e.errors[0]["code"] == "idempotency_key_conflict"
        assert "k-1" in e.detail

        # 422 with a JSON pointer per field.
        with pytest.raises(ApiError) as info:
            client.track(
                "x" * 201, user_id="u", occurred_at=dt.datetime.now().astimezone() + dt.timedelta(days=3)
            )
        e = info.value
        assert e.status == 422
        fields = {f.field: f.code for f in e.errors}
        assert fields.get("/event") == "invalid_length", e
        assert "/occurred_at" in fields, e

        # In a batch: the item's index and pointer; nothing of the batch is kept.
        with pytest.raises(ApiError) as info:
            client.batch(
                [
                    {"type": "track", "event": "ok", "user_id": "u", "idempotency_key": "never-1"},
                    {"type": "track", "event": "bad", "user_id": "", "idempotency_key": "never-2"},
                ]
            )
        e = info.value
        assert (e.status, e.code) == (422, "invalid_payload")
        assert e.errors[0].index == 1 and e.errors[0].field.startswith("/batch/1/")
        ok = client.track("ok", user_id="u", idempotency_key="never-1")
        assert ok.duplicate is False  # the refused batch stored nothing

        # Unknown fields are refused, not dropped.
        with pytest.raises(ApiError) as info:
            client.batch([{"type": "track", "event": "x", "user_id": "u", "occured_at": "typo"}])
        assert info.value.status == 422 and any(f.code == "unknown_field" for f in info.value.errors)

        # Query problems name the parameter.
        with pytest.raises(ApiError) as info:
            client.events_page(dt.datetime.now().astimezone(), dt.datetime.now().astimezone(), limit=5000)
        assert info.value.status == 400 and info.value.code == "invalid_query"
        assert info.value.errors and info.value.errors[0].field == "limit"

        with pytest.raises(ApiError) as info:
            client.get_contact(uuid.uuid4())
        assert (info.value.status, info.value.code) == (404, "not_found")

    with Client("fsk_not_a_key", base_url=server.base_url, max_retries=0) as bad:
        with pytest.raises(ApiError) as info:
            bad.list_jobs()
        assert (info.value.status, info.value.code) == (401, "unauthorized")


def test_transport_error_when_nobody_listens() -> None:
    with Client("fsk_x", base_url=f"http://127.0.0.1:{free_port()}", max_retries=1) as client:
        with pytest.raises(TransportError):
            client.track("x", user_id="u")


def test_pagination_over_2500_events(server: Server, api_key: str) -> None:
    n = 2500
    with Client(api_key, base_url=server.base_url) as client:
        base = dt.datetime.now().astimezone() - dt.timedelta(hours=1)
        sent: list[str] = []
        for start in range(0, n, 500):
            acks = client.batch(
                [
                    {
                        "type": "track",
                        "event": "Page",
                        "user_id": f"u-{i % 7}",
                        "properties": {"i": i},
                        "occurred_at": base + dt.timedelta(milliseconds=i),
                        "idempotency_key": f"page-{i}",
                    }
                    for i in range(start, start + 500)
                ]
            )
            sent += [str(a.id) for a in acks]
        assert len(set(sent)) == n

        wait_for(lambda: len(all_events(client)) == n, timeout=60, what=f"{n} events readable")
        for page_size in (1000, 100):
            seen = all_events(client, page_size=page_size)
            assert len(seen) == n
            assert {str(e.id) for e in seen} == set(sent)
            # Ordered by occurred_at: property i follows the order we gave.
            assert [e.properties["i"] for e in seen] == list(range(n))
        frm, to = window()
        first = client.events_page(frm, to, limit=1000)
        assert len(first.events) == 1000 and first.next_cursor


def test_export_wait_and_stream(server: Server, api_key: str) -> None:
    with Client(api_key, base_url=server.base_url) as client:
        acks = client.batch(
            [
                {"type": "track", "event": "Exp", "user_id": f"u-{i}", "properties": {"i": i}}
                for i in range(20)
            ]
        )
        client.track("Other", user_id="u-x")
        wait_for(lambda: len(all_events(client)) == 21, what="21 events")
        frm, to = window()
        job_id = client.create_export(
            frm, to, event="Exp", metadata={"source": "sdk-test", "correlationId": "c-1"}
        )
        job = client.wait(job_id, timeout=60, poll_interval=0.1)
        assert job.status == "completed", job
        assert job.metadata["correlationId"] == "c-1"
        assert job.result.row_count == 20

        lines = list(client.stream_export(job_id))
        assert {str(e.id) for e in lines} == {str(a.id) for a in acks}
        assert all(e.event == "Exp" for e in lines)
        raw = list(client.stream_export(job_id, raw=True))
        assert len(raw) == 20 and all(isinstance(r, bytes) for r in raw)
        with closing(client.stream_export(job_id)) as it:  # stopping early closes the response
            assert next(it).event == "Exp"

        buf = io.BytesIO()
        size = client.download_export(job_id, buf)
        assert size == job.result.size_bytes == len(buf.getvalue())
        key = bytes.fromhex(server.cli("keys", "external-hmac", "--tenant", "default").strip())
        assert hmac.new(key, buf.getvalue(), hashlib.sha256).hexdigest() == job.result.hmac

        assert job_id in [str(j.job_id) for j in client.list_jobs(status="completed", limit=10)]
        assert str(client.get_job(job_id).job_id) == job_id

        with pytest.raises(ApiError) as info:
            list(client.stream_export(uuid.uuid4()))
        assert info.value.status == 404


def test_async_client(server: Server, api_key: str) -> None:
    async def main() -> None:
        async with AsyncClient(api_key, base_url=server.base_url) as client:
            when = dt.datetime.now().astimezone()
            a = await client.track(
                "Async", user_id="au-1", properties={"k": "v"}, occurred_at=when, idempotency_key="async-1"
            )
            again = await client.track(
                "Async", user_id="au-1", properties={"k": "v"}, occurred_at=when, idempotency_key="async-1"
            )
            assert again.id == a.id and again.duplicate
            await client.identify(user_id="au-1", traits={"t": 1})
            acks = await client.batch([{"type": "track", "event": "Async", "user_id": "au-2"}])
            assert len(acks) == 1
            with pytest.raises(ApiError) as info:
                await client.track("Other", user_id="au-1", idempotency_key="async-1")
            assert info.value.code == "idempotency_key_conflict"
            frm, to = window()
            deadline = asyncio.get_running_loop().time() + 30
            seen: list[EventOut] = []
            while asyncio.get_running_loop().time() < deadline:
                seen = [e async for e in client.events(frm, to, page_size=1)]
                if len(seen) == 3:
                    break
                await asyncio.sleep(0.2)
            assert len(seen) == 3
            contact = await client.find_contact(user_id="au-1")
            assert (await client.get_contact(contact.id)).id == contact.id
            job_id = await client.create_export(frm, to)
            job = await client.wait(job_id, timeout=60, poll_interval=0.1)
            assert job.status == "completed"
            lines = [e async for e in client.stream_export(job_id)]
            assert len(lines) == 3
            assert len(await client.list_jobs()) >= 1

    asyncio.run(main())


def test_erase_a_person_and_lift_the_suppression(server: Server, api_key: str) -> None:
    run = uuid.uuid4().hex
    user = f"gone-{run}"
    with Client(api_key, base_url=server.base_url) as client:
        client.track("Gone", user_id=user, properties={"run": run})
        client.track("Stays", user_id=f"stay-{run}", properties={"run": run})

        def ours() -> list[Any]:
            return [e for e in all_events(client) if "run" in e.properties and e.properties["run"] == run]

        wait_for(lambda: len(ours()) == 2, what="2 events")
        job_id = client.erase(user_ids=[user], suppress=True, metadata={"ticket": run})
        job = client.wait(job_id, timeout=60, poll_interval=0.1)
        assert job.status == "completed", job
        assert job.kind == "erasure"
        assert job.result.stores.tracked_events.events_removed == 1
        assert job.result.verification.found == 0
        # The certificate's HMAC, over its JSON without `hmac` and
        # `integrity`, keys sorted, no whitespace, as the server sent it.
        doc = client.api.get_httpx_client().get(f"/v1/core/jobs/{job_id}").json()
        cert = doc["result"]
        signature = cert.pop("hmac")
        cert.pop("integrity")
        key = bytes.fromhex(server.cli("keys", "external-hmac", "--tenant", "default").strip())
        text = json.dumps(cert, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert hmac.new(key, text.encode(), hashlib.sha256).hexdigest() == signature
        assert [e.event for e in ours()] == ["Stays"]

        sha = hashlib.sha256(user.encode()).hexdigest()
        [suppressed] = client.suppressions(user_id=user)
        assert suppressed.sha256 == sha and str(suppressed.request_id) == job_id
        lifted = client.lift_suppression(user_id=user)
        assert lifted.sha256 == sha
        with pytest.raises(ApiError) as info:
            client.lift_suppression(user_id=user)
        assert info.value.status == 404
        with pytest.raises(ValueError):
            client.erase()
