from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="ObjectErased")


@_attrs_define
class ObjectErased:
    """One object written again without the people.

    Attributes:
        events_removed (int):
        rows (int): Rows left in it.
        path (str | Unset): The archive's object key (archives).
        job_id (str | Unset): The export's job id (exports).
        sha256 (str | Unset): SHA-256 of the archive's new uncompressed content (as its new
            manifest says).
        hmac (str | Unset): The export result's new HMAC.
    """

    events_removed: int
    rows: int
    path: str | Unset = UNSET
    job_id: str | Unset = UNSET
    sha256: str | Unset = UNSET
    hmac: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        events_removed = self.events_removed

        rows = self.rows

        path = self.path

        job_id = self.job_id

        sha256 = self.sha256

        hmac = self.hmac

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "events_removed": events_removed,
                "rows": rows,
            }
        )
        if path is not UNSET:
            field_dict["path"] = path
        if job_id is not UNSET:
            field_dict["job_id"] = job_id
        if sha256 is not UNSET:
            field_dict["sha256"] = sha256
        if hmac is not UNSET:
            field_dict["hmac"] = hmac

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        events_removed = d.pop("events_removed")

        rows = d.pop("rows")

        path = d.pop("path", UNSET)

        job_id = d.pop("job_id", UNSET)

        sha256 = d.pop("sha256", UNSET)

        hmac = d.pop("hmac", UNSET)

        object_erased = cls(
            events_removed=events_removed,
            rows=rows,
            path=path,
            job_id=job_id,
            sha256=sha256,
            hmac=hmac,
        )

        object_erased.additional_properties = d
        return object_erased

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
