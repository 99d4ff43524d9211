from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.subject_out import SubjectOut


T = TypeVar("T", bound="SuppressionLifted")


@_attrs_define
class SuppressionLifted:
    """The identifier whose suppression was lifted.

    Attributes:
        lifted (SubjectOut): An identifier as fastack keeps it after an erasure: its kind and the
            lowercase hex SHA-256 of its UTF-8 value (a contact id in its
            hyphenated lowercase form).
    """

    lifted: SubjectOut
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        lifted = self.lifted.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "lifted": lifted,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.subject_out import SubjectOut  # noqa: PLC0415

        d = dict(src_dict)
        lifted = SubjectOut.from_dict(d.pop("lifted"))

        suppression_lifted = cls(
            lifted=lifted,
        )

        suppression_lifted.additional_properties = d
        return suppression_lifted

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
