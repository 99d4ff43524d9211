from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="JobProtection")


@_attrs_define
class JobProtection:
    """
    Attributes:
        encrypted (bool):
        applied_by (str):
        mode (str):
    """

    encrypted: bool
    applied_by: str
    mode: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        encrypted = self.encrypted

        applied_by = self.applied_by

        mode = self.mode

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "encrypted": encrypted,
                "applied_by": applied_by,
                "mode": mode,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        encrypted = d.pop("encrypted")

        applied_by = d.pop("applied_by")

        mode = d.pop("mode")

        job_protection = cls(
            encrypted=encrypted,
            applied_by=applied_by,
            mode=mode,
        )

        job_protection.additional_properties = d
        return job_protection

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
