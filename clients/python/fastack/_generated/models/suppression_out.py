from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from .. import types
from ..models.subject_kind_out import SubjectKindOut

T = TypeVar("T", bound="SuppressionOut")


@_attrs_define
class SuppressionOut:
    """A suppressed identifier: processing drops its events.

    Attributes:
        kind (SubjectKindOut): An identifier's kind.
        sha256 (str):
        request_id (UUID): The erasure that set it.
        created_at (datetime.datetime):
        dropped (int): Events of the identifier dropped since.
    """

    kind: SubjectKindOut
    sha256: str
    request_id: UUID
    created_at: datetime.datetime
    dropped: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        kind = self.kind.value

        sha256 = self.sha256

        request_id = str(self.request_id)

        created_at = self.created_at.isoformat()

        dropped = self.dropped

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "kind": kind,
                "sha256": sha256,
                "request_id": request_id,
                "created_at": created_at,
                "dropped": dropped,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        kind = SubjectKindOut(d.pop("kind"))

        sha256 = d.pop("sha256")

        request_id = UUID(d.pop("request_id"))

        created_at = types.parse_datetime(d.pop("created_at"))

        dropped = d.pop("dropped")

        suppression_out = cls(
            kind=kind,
            sha256=sha256,
            request_id=request_id,
            created_at=created_at,
            dropped=dropped,
        )

        suppression_out.additional_properties = d
        return suppression_out

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
