from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from .. import types

if TYPE_CHECKING:
    from ..models.contact_out_traits import ContactOutTraits


T = TypeVar("T", bound="ContactOut")


@_attrs_define
class ContactOut:
    """A contact: everything known to be one person.

    Attributes:
        id (UUID):
        user_ids (list[str]):
        anonymous_ids (list[str]):
        traits (ContactOutTraits):
        merged_ids (list[UUID]): Contacts merged into this one by an identify.
        created_at (datetime.datetime):
        updated_at (datetime.datetime):
    """

    id: UUID
    user_ids: list[str]
    anonymous_ids: list[str]
    traits: ContactOutTraits
    merged_ids: list[UUID]
    created_at: datetime.datetime
    updated_at: datetime.datetime
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        id = str(self.id)

        user_ids = self.user_ids

        anonymous_ids = self.anonymous_ids

        traits = self.traits.to_dict()

        merged_ids = []
        for merged_ids_item_data in self.merged_ids:
            merged_ids_item = str(merged_ids_item_data)
            merged_ids.append(merged_ids_item)

        created_at = self.created_at.isoformat()

        updated_at = self.updated_at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "id": id,
                "user_ids": user_ids,
                "anonymous_ids": anonymous_ids,
                "traits": traits,
                "merged_ids": merged_ids,
                "created_at": created_at,
                "updated_at": updated_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.contact_out_traits import ContactOutTraits  # noqa: PLC0415

        d = dict(src_dict)
        id = UUID(d.pop("id"))

        user_ids = cast(list[str], d.pop("user_ids"))

        anonymous_ids = cast(list[str], d.pop("anonymous_ids"))

        traits = ContactOutTraits.from_dict(d.pop("traits"))

        merged_ids = []
        _merged_ids = d.pop("merged_ids")
        for merged_ids_item_data in _merged_ids:
            merged_ids_item = UUID(merged_ids_item_data)

            merged_ids.append(merged_ids_item)

        created_at = types.parse_datetime(d.pop("created_at"))

        updated_at = types.parse_datetime(d.pop("updated_at"))

        contact_out = cls(
            id=id,
            user_ids=user_ids,
            anonymous_ids=anonymous_ids,
            traits=traits,
            merged_ids=merged_ids,
            created_at=created_at,
            updated_at=updated_at,
        )

        contact_out.additional_properties = d
        return contact_out

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
