from __future__ import annotations

from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.problem import Problem
from ...models.suppression_list import SuppressionList
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    limit: int | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    params["user_id"] = user_id

    params["anonymous_id"] = anonymous_id

    params["limit"] = limit

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/core/suppressions",
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Problem | SuppressionList | None:
    if response.status_code == 200:
        response_200 = SuppressionList.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = Problem.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

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
) -> Response[Problem | SuppressionList]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    limit: int | Unset = UNSET,
) -> Response[Problem | SuppressionList]:
    """List suppressions

     The tenant's suppressed identifiers (hashed), newest first; with
    `user_id` or `anonymous_id`, whether that one is suppressed. Rules a
    schema cannot say: to ask about one identifier, give exactly one of
    `user_id` or `anonymous_id`.

    Args:
        user_id (str | Unset):
        anonymous_id (str | Unset):
        limit (int | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | SuppressionList]
    """

    kwargs = _get_kwargs(
        user_id=user_id,
        anonymous_id=anonymous_id,
        limit=limit,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    limit: int | Unset = UNSET,
) -> Problem | SuppressionList | None:
    """List suppressions

     The tenant's suppressed identifiers (hashed), newest first; with
    `user_id` or `anonymous_id`, whether that one is suppressed. Rules a
    schema cannot say: to ask about one identifier, give exactly one of
    `user_id` or `anonymous_id`.

    Args:
        user_id (str | Unset):
        anonymous_id (str | Unset):
        limit (int | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Problem | SuppressionList
    """

    return sync_detailed(
        client=client,
        user_id=user_id,
        anonymous_id=anonymous_id,
        limit=limit,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    limit: int | Unset = UNSET,
) -> Response[Problem | SuppressionList]:
    """List suppressions

     The tenant's suppressed identifiers (hashed), newest first; with
    `user_id` or `anonymous_id`, whether that one is suppressed. Rules a
    schema cannot say: to ask about one identifier, give exactly one of
    `user_id` or `anonymous_id`.

    Args:
        user_id (str | Unset):
        anonymous_id (str | Unset):
        limit (int | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | SuppressionList]
    """

    kwargs = _get_kwargs(
        user_id=user_id,
        anonymous_id=anonymous_id,
        limit=limit,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    limit: int | Unset = UNSET,
) -> Problem | SuppressionList | None:
    """List suppressions

     The tenant's suppressed identifiers (hashed), newest first; with
    `user_id` or `anonymous_id`, whether that one is suppressed. Rules a
    schema cannot say: to ask about one identifier, give exactly one of
    `user_id` or `anonymous_id`.

    Args:
        user_id (str | Unset):
        anonymous_id (str | Unset):
        limit (int | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Problem | SuppressionList
    """

    return (
        await asyncio_detailed(
            client=client,
            user_id=user_id,
            anonymous_id=anonymous_id,
            limit=limit,
        )
    ).parsed
