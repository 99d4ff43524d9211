from __future__ import annotations

from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.problem import Problem
from ...models.suppression_lifted import SuppressionLifted
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    params["user_id"] = user_id

    params["anonymous_id"] = anonymous_id

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "delete",
        "url": "/v1/core/suppressions",
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Problem | SuppressionLifted | None:
    if response.status_code == 200:
        response_200 = SuppressionLifted.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = Problem.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = Problem.from_dict(response.json())

        return response_404

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
) -> Response[Problem | SuppressionLifted]:
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
) -> Response[Problem | SuppressionLifted]:
    """Lift a suppression

     The identifier's events are processed again from now on (those
    dropped meanwhile stay dropped). Give exactly one of `user_id` or
    `anonymous_id`; 404 when it is not suppressed.

    Args:
        user_id (str | Unset):
        anonymous_id (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | SuppressionLifted]
    """

    kwargs = _get_kwargs(
        user_id=user_id,
        anonymous_id=anonymous_id,
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
) -> Problem | SuppressionLifted | None:
    """Lift a suppression

     The identifier's events are processed again from now on (those
    dropped meanwhile stay dropped). Give exactly one of `user_id` or
    `anonymous_id`; 404 when it is not suppressed.

    Args:
        user_id (str | Unset):
        anonymous_id (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Problem | SuppressionLifted
    """

    return sync_detailed(
        client=client,
        user_id=user_id,
        anonymous_id=anonymous_id,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
) -> Response[Problem | SuppressionLifted]:
    """Lift a suppression

     The identifier's events are processed again from now on (those
    dropped meanwhile stay dropped). Give exactly one of `user_id` or
    `anonymous_id`; 404 when it is not suppressed.

    Args:
        user_id (str | Unset):
        anonymous_id (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | SuppressionLifted]
    """

    kwargs = _get_kwargs(
        user_id=user_id,
        anonymous_id=anonymous_id,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
) -> Problem | SuppressionLifted | None:
    """Lift a suppression

     The identifier's events are processed again from now on (those
    dropped meanwhile stay dropped). Give exactly one of `user_id` or
    `anonymous_id`; 404 when it is not suppressed.

    Args:
        user_id (str | Unset):
        anonymous_id (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Problem | SuppressionLifted
    """

    return (
        await asyncio_detailed(
            client=client,
            user_id=user_id,
            anonymous_id=anonymous_id,
        )
    ).parsed
