from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.subject_kind_out import SubjectKindOut

T = TypeVar("T", bound="SubjectOut")


@_attrs_define
class SubjectOut:
    """An identifier as fastack keeps it after an erasure: its kind and the
    lowercase hex SHA-256 of its UTF-8 value (a contact id in its
    hyphenated lowercase form).

        Attributes:
            kind (SubjectKindOut): An identifier's kind.
            sha256 (str):
    """

    kind: SubjectKindOut
    sha256: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        kind = self.kind.value

        sha256 = self.sha256

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "kind": kind,
                "sha256": sha256,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        kind = SubjectKindOut(d.pop("kind"))

        sha256 = d.pop("sha256")

        subject_out = cls(
            kind=kind,
            sha256=sha256,
        )

        subject_out.additional_properties = d
        return subject_out

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
