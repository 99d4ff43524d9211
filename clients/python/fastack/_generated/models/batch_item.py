from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from .. import types
from ..models.event_type import EventType
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.batch_item_properties import BatchItemProperties
    from ..models.batch_item_traits import BatchItemTraits


T = TypeVar("T", bound="BatchItem")


@_attrs_define
class BatchItem:
    """One batch item: a track or identify with its `type`.

    Attributes:
        type_ (EventType): The kind of a batch item (and of a stored event).
        occurred_at (datetime.datetime): RFC 3339 with offset.
        idempotency_key (str): 1–255 characters, unique per tenant.
        event (str | Unset): Required for `track` (1–200 characters).
        user_id (str | Unset): 1–255 characters; one of `user_id` / `anonymous_id` is required.
        anonymous_id (str | Unset): 1–255 characters.
        properties (BatchItemProperties | Unset): For `track`.
        traits (BatchItemTraits | Unset): For `identify`.
        sent_at (datetime.datetime | Unset):
    """

    type_: EventType
    occurred_at: datetime.datetime
    idempotency_key: str
    event: str | Unset = UNSET
    user_id: str | Unset = UNSET
    anonymous_id: str | Unset = UNSET
    properties: BatchItemProperties | Unset = UNSET
    traits: BatchItemTraits | Unset = UNSET
    sent_at: datetime.datetime | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        type_ = self.type_.value

        occurred_at = self.occurred_at.isoformat()

        idempotency_key = self.idempotency_key

        event = self.event

        user_id = self.user_id

        anonymous_id = self.anonymous_id

        properties: dict[str, Any] | Unset = UNSET
        if not isinstance(self.properties, Unset):
            properties = self.properties.to_dict()

        traits: dict[str, Any] | Unset = UNSET
        if not isinstance(self.traits, Unset):
            traits = self.traits.to_dict()

        sent_at: str | Unset = UNSET
        if not isinstance(self.sent_at, Unset):
            sent_at = self.sent_at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "type": type_,
                "occurred_at": occurred_at,
                "idempotency_key": idempotency_key,
            }
        )
        if event is not UNSET:
            field_dict["event"] = event
        if user_id is not UNSET:
            field_dict["user_id"] = user_id
        if anonymous_id is not UNSET:
            field_dict["anonymous_id"] = anonymous_id
        if properties is not UNSET:
            field_dict["properties"] = properties
        if traits is not UNSET:
            field_dict["traits"] = traits
        if sent_at is not UNSET:
            field_dict["sent_at"] = sent_at

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.batch_item_properties import BatchItemProperties  # noqa: PLC0415
        from ..models.batch_item_traits import BatchItemTraits  # noqa: PLC0415

        d = dict(src_dict)
        type_ = EventType(d.pop("type"))

        occurred_at = types.parse_datetime(d.pop("occurred_at"))

        idempotency_key = d.pop("idempotency_key")

        event = d.pop("event", UNSET)

        user_id = d.pop("user_id", UNSET)

        anonymous_id = d.pop("anonymous_id", UNSET)

        _properties = d.pop("properties", UNSET)
        properties: BatchItemProperties | Unset
        if isinstance(_properties, Unset):
            properties = UNSET
        else:
            properties = BatchItemProperties.from_dict(_properties)

        _traits = d.pop("traits", UNSET)
        traits: BatchItemTraits | Unset
        if isinstance(_traits, Unset):
            traits = UNSET
        else:
            traits = BatchItemTraits.from_dict(_traits)

        _sent_at = d.pop("sent_at", UNSET)
        sent_at: datetime.datetime | Unset
        if isinstance(_sent_at, Unset):
            sent_at = UNSET
        else:
            sent_at = types.parse_datetime(_sent_at)

        batch_item = cls(
            type_=type_,
            occurred_at=occurred_at,
            idempotency_key=idempotency_key,
            event=event,
            user_id=user_id,
            anonymous_id=anonymous_id,
            properties=properties,
            traits=traits,
            sent_at=sent_at,
        )

        batch_item.additional_properties = d
        return batch_item

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
