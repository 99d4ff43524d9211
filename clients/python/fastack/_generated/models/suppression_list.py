from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.suppression_out import SuppressionOut


T = TypeVar("T", bound="SuppressionList")


@_attrs_define
class SuppressionList:
    """
    Attributes:
        suppressions (list[SuppressionOut]):
    """

    suppressions: list[SuppressionOut]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        suppressions = []
        for suppressions_item_data in self.suppressions:
            suppressions_item = suppressions_item_data.to_dict()
            suppressions.append(suppressions_item)

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "suppressions": suppressions,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.suppression_out import SuppressionOut  # noqa: PLC0415

        d = dict(src_dict)
        suppressions = []
        _suppressions = d.pop("suppressions")
        for suppressions_item_data in _suppressions:
            suppressions_item = SuppressionOut.from_dict(suppressions_item_data)

            suppressions.append(suppressions_item)

        suppression_list = cls(
            suppressions=suppressions,
        )

        suppression_list.additional_properties = d
        return suppression_list

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
