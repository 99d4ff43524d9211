from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="ErasureVerification")


@_attrs_define
class ErasureVerification:
    """The verification pass: every store looked at again after the work.

    Attributes:
        checked_at (str):
        found (int): Records of the people found (always 0 in a certificate: an erasure
            that still finds some fails).
        stores (list[str]):
    """

    checked_at: str
    found: int
    stores: list[str]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        checked_at = self.checked_at

        found = self.found

        stores = self.stores

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "checked_at": checked_at,
                "found": found,
                "stores": stores,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        checked_at = d.pop("checked_at")

        found = d.pop("found")

        stores = cast(list[str], d.pop("stores"))

        erasure_verification = cls(
            checked_at=checked_at,
            found=found,
            stores=stores,
        )

        erasure_verification.additional_properties = d
        return erasure_verification

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
