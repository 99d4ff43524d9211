from __future__ import annotations

from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.ack import Ack
from ...models.problem import Problem
from ...models.track_request import TrackRequest
from ...types import Response


def _get_kwargs(
    *,
    body: TrackRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/core/track",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Ack | Problem | None:
    if response.status_code == 202:
        response_202 = Ack.from_dict(response.json())

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

    if response.status_code == 409:
        response_409 = Problem.from_dict(response.json())

        return response_409

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
) -> Response[Ack | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    body: TrackRequest,
) -> Response[Ack | Problem]:
    """Track an event

     Authenticates, validates, rate-limits, durably queues and answers
    202 with the event id. Same `idempotency_key` and content: the
    original id with `duplicate: true`. Same key, other content: 409.

    Args:
        body (TrackRequest): `POST /v1/core/track`. One of `user_id` / `anonymous_id` is required.
            Unknown fields are rejected (`unknown_field`). Ids, key and name hold no
            control characters; no string or member name holds NUL or a lone
            surrogate, and numbers must be storable exactly (README "Input rules").

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Ack | Problem]
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
    body: TrackRequest,
) -> Ack | Problem | None:
    """Track an event

     Authenticates, validates, rate-limits, durably queues and answers
    202 with the event id. Same `idempotency_key` and content: the
    original id with `duplicate: true`. Same key, other content: 409.

    Args:
        body (TrackRequest): `POST /v1/core/track`. One of `user_id` / `anonymous_id` is required.
            Unknown fields are rejected (`unknown_field`). Ids, key and name hold no
            control characters; no string or member name holds NUL or a lone
            surrogate, and numbers must be storable exactly (README "Input rules").

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Ack | Problem
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    body: TrackRequest,
) -> Response[Ack | Problem]:
    """Track an event

     Authenticates, validates, rate-limits, durably queues and answers
    202 with the event id. Same `idempotency_key` and content: the
    original id with `duplicate: true`. Same key, other content: 409.

    Args:
        body (TrackRequest): `POST /v1/core/track`. One of `user_id` / `anonymous_id` is required.
            Unknown fields are rejected (`unknown_field`). Ids, key and name hold no
            control characters; no string or member name holds NUL or a lone
            surrogate, and numbers must be storable exactly (README "Input rules").

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Ack | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    body: TrackRequest,
) -> Ack | Problem | None:
    """Track an event

     Authenticates, validates, rate-limits, durably queues and answers
    202 with the event id. Same `idempotency_key` and content: the
    original id with `duplicate: true`. Same key, other content: 409.

    Args:
        body (TrackRequest): `POST /v1/core/track`. One of `user_id` / `anonymous_id` is required.
            Unknown fields are rejected (`unknown_field`). Ids, key and name hold no
            control characters; no string or member name holds NUL or a lone
            surrogate, and numbers must be storable exactly (README "Input rules").

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Ack | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
