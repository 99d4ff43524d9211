from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from .. import types

T = TypeVar("T", bound="TrackingPlanOut")


@_attrs_define
class TrackingPlanOut:
    """A tenant's tracking plan: one JSON Schema (draft 2020-12) per event
    name for `track` properties, one for `identify` traits.

        Attributes:
            version (int):
            installed_at (datetime.datetime):
            document (Any): `{"events": {name: schema}, "identify": schema, "unplanned":
                "allow"|"reject", "mode": "enforce"|"flag", "$defs": {...}}`
    """

    version: int
    installed_at: datetime.datetime
    document: Any
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        version = self.version

        installed_at = self.installed_at.isoformat()

        document = self.document

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "version": version,
                "installed_at": installed_at,
                "document": document,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        version = d.pop("version")

        installed_at = types.parse_datetime(d.pop("installed_at"))

        document = d.pop("document")

        tracking_plan_out = cls(
            version=version,
            installed_at=installed_at,
            document=document,
        )

        tracking_plan_out.additional_properties = d
        return tracking_plan_out

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
