from __future__ import annotations

from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.erasure_accepted import ErasureAccepted
from ...models.erasure_request_body import ErasureRequestBody
from ...models.problem import Problem
from ...types import Response


def _get_kwargs(
    *,
    body: ErasureRequestBody,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/core/erasures",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ErasureAccepted | Problem | None:
    if response.status_code == 202:
        response_202 = ErasureAccepted.from_dict(response.json())

        return response_202

    if response.status_code == 400:
        response_400 = Problem.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 408:
        response_408 = Problem.from_dict(response.json())

        return response_408

    if response.status_code == 413:
        response_413 = Problem.from_dict(response.json())

        return response_413

    if response.status_code == 415:
        response_415 = Problem.from_dict(response.json())

        return response_415

    if response.status_code == 422:
        response_422 = Problem.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Problem.from_dict(response.json())

        return response_429

    if response.status_code == 500:
        response_500 = Problem.from_dict(response.json())

        return response_500

    if response.status_code == 503:
        response_503 = Problem.from_dict(response.json())

        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[ErasureAccepted | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    body: ErasureRequestBody,
) -> Response[ErasureAccepted | Problem]:
    """Erase people

     Queues an erasure: the people named, every identifier linked to
    them, and their data in every store fastack keeps (events in every
    monthly partition, contacts and identities, retention archives and
    stored export results, the Parquet lake, events still owed to
    RabbitMQ or webhooks, stored webhook payloads, quarantine) are
    removed. With `from`/`to` only events that occurred in the window
    go and the contact stays. Events accepted before this answer are
    covered; a retry of an erased event with its idempotency key is
    answered as the duplicate it is and not stored again. A person
    fastack does not know completes with zero counts. The job ends in
    `job.completed` (its result is the certificate) or `job.failed`, and
    `core.contact.erased` tells downstream consumers (hashes only).
    Rules a schema cannot say: name at least one person, with 1 to
    5,000 identifiers in all; `to` must be after `from`.

    Args:
        body (ErasureRequestBody): `POST /v1/core/erasures`. Name people by any of their
            identifiers: 1 to
            5,000 identifiers in all across `user_ids`, `anonymous_ids` and
            `contact_ids` (more is `422 invalid_payload`, code
            `too_many_identifiers`). Each resolves to its contact (merges followed)
            and every identifier linked to it. Ids hold no control characters. No
            string or member name in
            `metadata` holds NUL or a lone surrogate, and numbers must be storable
            exactly.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErasureAccepted | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    body: ErasureRequestBody,
) -> ErasureAccepted | Problem | None:
    """Erase people

     Queues an erasure: the people named, every identifier linked to
    them, and their data in every store fastack keeps (events in every
    monthly partition, contacts and identities, retention archives and
    stored export results, the Parquet lake, events still owed to
    RabbitMQ or webhooks, stored webhook payloads, quarantine) are
    removed. With `from`/`to` only events that occurred in the window
    go and the contact stays. Events accepted before this answer are
    covered; a retry of an erased event with its idempotency key is
    answered as the duplicate it is and not stored again. A person
    fastack does not know completes with zero counts. The job ends in
    `job.completed` (its result is the certificate) or `job.failed`, and
    `core.contact.erased` tells downstream consumers (hashes only).
    Rules a schema cannot say: name at least one person, with 1 to
    5,000 identifiers in all; `to` must be after `from`.

    Args:
        body (ErasureRequestBody): `POST /v1/core/erasures`. Name people by any of their
            identifiers: 1 to
            5,000 identifiers in all across `user_ids`, `anonymous_ids` and
            `contact_ids` (more is `422 invalid_payload`, code
            `too_many_identifiers`). Each resolves to its contact (merges followed)
            and every identifier linked to it. Ids hold no control characters. No
            string or member name in
            `metadata` holds NUL or a lone surrogate, and numbers must be storable
            exactly.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErasureAccepted | Problem
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    body: ErasureRequestBody,
) -> Response[ErasureAccepted | Problem]:
    """Erase people

     Queues an erasure: the people named, every identifier linked to
    them, and their data in every store fastack keeps (events in every
    monthly partition, contacts and identities, retention archives and
    stored export results, the Parquet lake, events still owed to
    RabbitMQ or webhooks, stored webhook payloads, quarantine) are
    removed. With `from`/`to` only events that occurred in the window
    go and the contact stays. Events accepted before this answer are
    covered; a retry of an erased event with its idempotency key is
    answered as the duplicate it is and not stored again. A person
    fastack does not know completes with zero counts. The job ends in
    `job.completed` (its result is the certificate) or `job.failed`, and
    `core.contact.erased` tells downstream consumers (hashes only).
    Rules a schema cannot say: name at least one person, with 1 to
    5,000 identifiers in all; `to` must be after `from`.

    Args:
        body (ErasureRequestBody): `POST /v1/core/erasures`. Name people by any of their
            identifiers: 1 to
            5,000 identifiers in all across `user_ids`, `anonymous_ids` and
            `contact_ids` (more is `422 invalid_payload`, code
            `too_many_identifiers`). Each resolves to its contact (merges followed)
            and every identifier linked to it. Ids hold no control characters. No
            string or member name in
            `metadata` holds NUL or a lone surrogate, and numbers must be storable
            exactly.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErasureAccepted | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    body: ErasureRequestBody,
) -> ErasureAccepted | Problem | None:
    """Erase people

     Queues an erasure: the people named, every identifier linked to
    them, and their data in every store fastack keeps (events in every
    monthly partition, contacts and identities, retention archives and
    stored export results, the Parquet lake, events still owed to
    RabbitMQ or webhooks, stored webhook payloads, quarantine) are
    removed. With `from`/`to` only events that occurred in the window
    go and the contact stays. Events accepted before this answer are
    covered; a retry of an erased event with its idempotency key is
    answered as the duplicate it is and not stored again. A person
    fastack does not know completes with zero counts. The job ends in
    `job.completed` (its result is the certificate) or `job.failed`, and
    `core.contact.erased` tells downstream consumers (hashes only).
    Rules a schema cannot say: name at least one person, with 1 to
    5,000 identifiers in all; `to` must be after `from`.

    Args:
        body (ErasureRequestBody): `POST /v1/core/erasures`. Name people by any of their
            identifiers: 1 to
            5,000 identifiers in all across `user_ids`, `anonymous_ids` and
            `contact_ids` (more is `422 invalid_payload`, code
            `too_many_identifiers`). Each resolves to its contact (merges followed)
            and every identifier linked to it. Ids hold no control characters. No
            string or member name in
            `metadata` holds NUL or a lone surrogate, and numbers must be storable
            exactly.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErasureAccepted | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
