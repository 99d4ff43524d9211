from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="ContactsErased")


@_attrs_define
class ContactsErased:
    """
    Attributes:
        contacts_removed (int):
        identities_removed (int):
        traits_removed (int): With a window (the contact stays): traits an erased `identify` had
            set, removed where the contact still held them.
    """

    contacts_removed: int
    identities_removed: int
    traits_removed: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        contacts_removed = self.contacts_removed

        identities_removed = self.identities_removed

        traits_removed = self.traits_removed

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "contacts_removed": contacts_removed,
                "identities_removed": identities_removed,
                "traits_removed": traits_removed,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        contacts_removed = d.pop("contacts_removed")

        identities_removed = d.pop("identities_removed")

        traits_removed = d.pop("traits_removed")

        contacts_erased = cls(
            contacts_removed=contacts_removed,
            identities_removed=identities_removed,
            traits_removed=traits_removed,
        )

        contacts_erased.additional_properties = d
        return contacts_erased

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
