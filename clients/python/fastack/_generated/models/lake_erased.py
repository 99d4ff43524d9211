from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="LakeErased")


@_attrs_define
class LakeErased:
    """
    Attributes:
        files_rewritten (int):
        files_removed (int):
        events_removed (int):
        table_version (int | Unset): The version of the tenant's Delta table whose commit replaced the
            files: no readable version from it on holds the person, and the
            versions before it name files that are deleted. Absent when no file
            of the table held the person.
    """

    files_rewritten: int
    files_removed: int
    events_removed: int
    table_version: int | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        files_rewritten = self.files_rewritten

        files_removed = self.files_removed

        events_removed = self.events_removed

        table_version = self.table_version

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "files_rewritten": files_rewritten,
                "files_removed": files_removed,
                "events_removed": events_removed,
            }
        )
        if table_version is not UNSET:
            field_dict["table_version"] = table_version

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        files_rewritten = d.pop("files_rewritten")

        files_removed = d.pop("files_removed")

        events_removed = d.pop("events_removed")

        table_version = d.pop("table_version", UNSET)

        lake_erased = cls(
            files_rewritten=files_rewritten,
            files_removed=files_removed,
            events_removed=events_removed,
            table_version=table_version,
        )

        lake_erased.additional_properties = d
        return lake_erased

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
