from __future__ import annotations

import datetime
from http import HTTPStatus
from typing import Any
from uuid import UUID

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.events_page import EventsPage
from ...models.problem import Problem
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    from_: datetime.datetime,
    to: datetime.datetime,
    contact_id: UUID | Unset = UNSET,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    event: str | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    json_from_ = from_.isoformat()
    params["from"] = json_from_

    json_to = to.isoformat()
    params["to"] = json_to

    json_contact_id: str | Unset = UNSET
    if not isinstance(contact_id, Unset):
        json_contact_id = str(contact_id)
    params["contact_id"] = json_contact_id

    params["user_id"] = user_id

    params["anonymous_id"] = anonymous_id

    params["event"] = event

    params["limit"] = limit

    params["cursor"] = cursor

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/core/events",
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> EventsPage | Problem | None:
    if response.status_code == 200:
        response_200 = EventsPage.from_dict(response.json())

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
) -> Response[EventsPage | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    from_: datetime.datetime,
    to: datetime.datetime,
    contact_id: UUID | Unset = UNSET,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    event: str | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> Response[EventsPage | Problem]:
    """List events

     Events with `from <= occurred_at < to` (both required: they are the
    partition key; `to` must be after `from`), ordered by `occurred_at`
    then id. One person's events by at most one of `contact_id`,
    `user_id` or `anonymous_id` (400 `invalid_query` for more): an id is
    resolved to its contact, and a contact includes the contacts merged
    into it, so every event of the person is listed, sent under any of
    their ids. An id nobody sent answers an empty page.

    Args:
        from_ (datetime.datetime):
        to (datetime.datetime):
        contact_id (UUID | Unset):
        user_id (str | Unset):
        anonymous_id (str | Unset):
        event (str | Unset):
        limit (int | Unset):
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EventsPage | Problem]
    """

    kwargs = _get_kwargs(
        from_=from_,
        to=to,
        contact_id=contact_id,
        user_id=user_id,
        anonymous_id=anonymous_id,
        event=event,
        limit=limit,
        cursor=cursor,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    from_: datetime.datetime,
    to: datetime.datetime,
    contact_id: UUID | Unset = UNSET,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    event: str | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> EventsPage | Problem | None:
    """List events

     Events with `from <= occurred_at < to` (both required: they are the
    partition key; `to` must be after `from`), ordered by `occurred_at`
    then id. One person's events by at most one of `contact_id`,
    `user_id` or `anonymous_id` (400 `invalid_query` for more): an id is
    resolved to its contact, and a contact includes the contacts merged
    into it, so every event of the person is listed, sent under any of
    their ids. An id nobody sent answers an empty page.

    Args:
        from_ (datetime.datetime):
        to (datetime.datetime):
        contact_id (UUID | Unset):
        user_id (str | Unset):
        anonymous_id (str | Unset):
        event (str | Unset):
        limit (int | Unset):
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EventsPage | Problem
    """

    return sync_detailed(
        client=client,
        from_=from_,
        to=to,
        contact_id=contact_id,
        user_id=user_id,
        anonymous_id=anonymous_id,
        event=event,
        limit=limit,
        cursor=cursor,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    from_: datetime.datetime,
    to: datetime.datetime,
    contact_id: UUID | Unset = UNSET,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    event: str | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> Response[EventsPage | Problem]:
    """List events

     Events with `from <= occurred_at < to` (both required: they are the
    partition key; `to` must be after `from`), ordered by `occurred_at`
    then id. One person's events by at most one of `contact_id`,
    `user_id` or `anonymous_id` (400 `invalid_query` for more): an id is
    resolved to its contact, and a contact includes the contacts merged
    into it, so every event of the person is listed, sent under any of
    their ids. An id nobody sent answers an empty page.

    Args:
        from_ (datetime.datetime):
        to (datetime.datetime):
        contact_id (UUID | Unset):
        user_id (str | Unset):
        anonymous_id (str | Unset):
        event (str | Unset):
        limit (int | Unset):
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EventsPage | Problem]
    """

    kwargs = _get_kwargs(
        from_=from_,
        to=to,
        contact_id=contact_id,
        user_id=user_id,
        anonymous_id=anonymous_id,
        event=event,
        limit=limit,
        cursor=cursor,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    from_: datetime.datetime,
    to: datetime.datetime,
    contact_id: UUID | Unset = UNSET,
    user_id: str | Unset = UNSET,
    anonymous_id: str | Unset = UNSET,
    event: str | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> EventsPage | Problem | None:
    """List events

     Events with `from <= occurred_at < to` (both required: they are the
    partition key; `to` must be after `from`), ordered by `occurred_at`
    then id. One person's events by at most one of `contact_id`,
    `user_id` or `anonymous_id` (400 `invalid_query` for more): an id is
    resolved to its contact, and a contact includes the contacts merged
    into it, so every event of the person is listed, sent under any of
    their ids. An id nobody sent answers an empty page.

    Args:
        from_ (datetime.datetime):
        to (datetime.datetime):
        contact_id (UUID | Unset):
        user_id (str | Unset):
        anonymous_id (str | Unset):
        event (str | Unset):
        limit (int | Unset):
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EventsPage | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            from_=from_,
            to=to,
            contact_id=contact_id,
            user_id=user_id,
            anonymous_id=anonymous_id,
            event=event,
            limit=limit,
            cursor=cursor,
        )
    ).parsed
