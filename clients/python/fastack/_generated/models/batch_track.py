from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from .. import types
from ..models.track_type import TrackType
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.batch_track_properties import BatchTrackProperties


T = TypeVar("T", bound="BatchTrack")


@_attrs_define
class BatchTrack:
    """A `track` in a batch: the fields of `POST /v1/core/track` and `type`.

    Attributes:
        type_ (TrackType): The `type` of a batch `track`.
        event (str): Event name, 1–200 characters.
        occurred_at (datetime.datetime): When it happened, RFC 3339 with offset; at most 24 h in the future and
            inside the tenant's retention.
        idempotency_key (str): 1–255 characters, unique per tenant.
        user_id (str | Unset): 1–255 characters; one of `user_id` / `anonymous_id` is required.
        anonymous_id (str | Unset): 1–255 characters.
        properties (BatchTrackProperties | Unset): Free-form event properties.
        sent_at (datetime.datetime | Unset):
    """

    type_: TrackType
    event: str
    occurred_at: datetime.datetime
    idempotency_key: str
    user_id: str | Unset = UNSET
    anonymous_id: str | Unset = UNSET
    properties: BatchTrackProperties | Unset = UNSET
    sent_at: datetime.datetime | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        type_ = self.type_.value

        event = self.event

        occurred_at = self.occurred_at.isoformat()

        idempotency_key = self.idempotency_key

        user_id = self.user_id

        anonymous_id = self.anonymous_id

        properties: dict[str, Any] | Unset = UNSET
        if not isinstance(self.properties, Unset):
            properties = self.properties.to_dict()

        sent_at: str | Unset = UNSET
        if not isinstance(self.sent_at, Unset):
            sent_at = self.sent_at.isoformat()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "type": type_,
                "event": event,
                "occurred_at": occurred_at,
                "idempotency_key": idempotency_key,
            }
        )
        if user_id is not UNSET:
            field_dict["user_id"] = user_id
        if anonymous_id is not UNSET:
            field_dict["anonymous_id"] = anonymous_id
        if properties is not UNSET:
            field_dict["properties"] = properties
        if sent_at is not UNSET:
            field_dict["sent_at"] = sent_at

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.batch_track_properties import BatchTrackProperties  # noqa: PLC0415

        d = dict(src_dict)
        type_ = TrackType(d.pop("type"))

        event = d.pop("event")

        occurred_at = types.parse_datetime(d.pop("occurred_at"))

        idempotency_key = d.pop("idempotency_key")

        user_id = d.pop("user_id", UNSET)

        anonymous_id = d.pop("anonymous_id", UNSET)

        _properties = d.pop("properties", UNSET)
        properties: BatchTrackProperties | Unset
        if isinstance(_properties, Unset):
            properties = UNSET
        else:
            properties = BatchTrackProperties.from_dict(_properties)

        _sent_at = d.pop("sent_at", UNSET)
        sent_at: datetime.datetime | Unset
        if isinstance(_sent_at, Unset):
            sent_at = UNSET
        else:
            sent_at = types.parse_datetime(_sent_at)

        batch_track = cls(
            type_=type_,
            event=event,
            occurred_at=occurred_at,
            idempotency_key=idempotency_key,
            user_id=user_id,
            anonymous_id=anonymous_id,
            properties=properties,
            sent_at=sent_at,
        )

        return batch_track
