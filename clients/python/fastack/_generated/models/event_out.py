from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from .. import types
from ..models.event_type import EventType
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.event_out_properties import EventOutProperties
    from ..models.event_out_traits import EventOutTraits
    from ..models.schema_violation_out import SchemaViolationOut


T = TypeVar("T", bound="EventOut")


@_attrs_define
class EventOut:
    """A stored event. Absent fields are left out (never `null`): `event` for
    identify, the id the event did not carry, `properties` or `traits`.
    `core.event.tracked` bodies and export lines are the same JSON.

        Attributes:
            id (UUID):
            type_ (EventType): The kind of a batch item (and of a stored event).
            contact_id (UUID):
            occurred_at (datetime.datetime): The instant sent, with the caller's offset (normalised: leap
                seconds and digits beyond microseconds are not kept).
            received_at (datetime.datetime): When fastack accepted it (UTC).
            event (str | Unset):
            user_id (str | Unset):
            anonymous_id (str | Unset):
            properties (EventOutProperties | Unset): For `track`.
            traits (EventOutTraits | Unset): For `identify`.
            plan_version (int | Unset): The tracking plan version the event was checked against, when the
                tenant had a plan.
            schema_violations (list[SchemaViolationOut] | Unset): What broke the plan, for events accepted in `flag` mode.
    """

    id: UUID
    type_: EventType
    contact_id: UUID
    occurred_at: datetime.datetime
    received_at: datetime.datetime
    event: str | Unset = UNSET
    user_id: str | Unset = UNSET
    anonymous_id: str | Unset = UNSET
    properties: EventOutProperties | Unset = UNSET
    traits: EventOutTraits | Unset = UNSET
    plan_version: int | Unset = UNSET
    schema_violations: list[SchemaViolationOut] | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        id = str(self.id)

        type_ = self.type_.value

        contact_id = str(self.contact_id)

        occurred_at = self.occurred_at.isoformat()

        received_at = self.received_at.isoformat()

        event = self.event

        user_id = self.user_id

        anonymous_id = self.anonymous_id

        properties: dict[str, Any] | Unset = UNSET
        if not isinstance(self.properties, Unset):
            properties = self.properties.to_dict()

        traits: dict[str, Any] | Unset = UNSET
        if not isinstance(self.traits, Unset):
            traits = self.traits.to_dict()

        plan_version = self.plan_version

        schema_violations: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.schema_violations, Unset):
            schema_violations = []
            for schema_violations_item_data in self.schema_violations:
                schema_violations_item = schema_violations_item_data.to_dict()
                schema_violations.append(schema_violations_item)

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "id": id,
                "type": type_,
                "contact_id": contact_id,
                "occurred_at": occurred_at,
                "received_at": received_at,
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
        if plan_version is not UNSET:
            field_dict["plan_version"] = plan_version
        if schema_violations is not UNSET:
            field_dict["schema_violations"] = schema_violations

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.event_out_properties import EventOutProperties  # noqa: PLC0415
        from ..models.event_out_traits import EventOutTraits  # noqa: PLC0415
        from ..models.schema_violation_out import SchemaViolationOut  # noqa: PLC0415

        d = dict(src_dict)
        id = UUID(d.pop("id"))

        type_ = EventType(d.pop("type"))

        contact_id = UUID(d.pop("contact_id"))

        occurred_at = types.parse_datetime(d.pop("occurred_at"))

        received_at = types.parse_datetime(d.pop("received_at"))

        event = d.pop("event", UNSET)

        user_id = d.pop("user_id", UNSET)

        anonymous_id = d.pop("anonymous_id", UNSET)

        _properties = d.pop("properties", UNSET)
        properties: EventOutProperties | Unset
        if isinstance(_properties, Unset):
            properties = UNSET
        else:
            properties = EventOutProperties.from_dict(_properties)

        _traits = d.pop("traits", UNSET)
        traits: EventOutTraits | Unset
        if isinstance(_traits, Unset):
            traits = UNSET
        else:
            traits = EventOutTraits.from_dict(_traits)

        plan_version = d.pop("plan_version", UNSET)

        _schema_violations = d.pop("schema_violations", UNSET)
        schema_violations: list[SchemaViolationOut] | Unset = UNSET
        if _schema_violations is not UNSET:
            schema_violations = []
            for schema_violations_item_data in _schema_violations:
                schema_violations_item = SchemaViolationOut.from_dict(schema_violations_item_data)

                schema_violations.append(schema_violations_item)

        event_out = cls(
            id=id,
            type_=type_,
            contact_id=contact_id,
            occurred_at=occurred_at,
            received_at=received_at,
            event=event,
            user_id=user_id,
            anonymous_id=anonymous_id,
            properties=properties,
            traits=traits,
            plan_version=plan_version,
            schema_violations=schema_violations,
        )

        event_out.additional_properties = d
        return event_out

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
