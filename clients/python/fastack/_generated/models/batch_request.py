from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.batch_item import BatchItem


T = TypeVar("T", bound="BatchRequest")


@_attrs_define
class BatchRequest:
    """`POST /v1/core/batch`: 1–500 items, all accepted or none.

    Attributes:
        batch (list[BatchItem]):
    """

    batch: list[BatchItem]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        batch = []
        for batch_item_data in self.batch:
            batch_item = batch_item_data.to_dict()
            batch.append(batch_item)

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "batch": batch,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.batch_item import BatchItem  # noqa: PLC0415

        d = dict(src_dict)
        batch = []
        _batch = d.pop("batch")
        for batch_item_data in _batch:
            batch_item = BatchItem.from_dict(batch_item_data)

            batch.append(batch_item)

        batch_request = cls(
            batch=batch,
        )

        batch_request.additional_properties = d
        return batch_request

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
