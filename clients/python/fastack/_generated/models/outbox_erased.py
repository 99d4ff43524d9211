from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="OutboxErased")


@_attrs_define
class OutboxErased:
    """
    Attributes:
        rows_cancelled (int): Rows owed to RabbitMQ or the lake that will not be sent.
        rows_rewritten (int): Grouped rows (the lake's) written again without the people.
        events_removed (int):
    """

    rows_cancelled: int
    rows_rewritten: int
    events_removed: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        rows_cancelled = self.rows_cancelled

        rows_rewritten = self.rows_rewritten

        events_removed = self.events_removed

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "rows_cancelled": rows_cancelled,
                "rows_rewritten": rows_rewritten,
                "events_removed": events_removed,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        rows_cancelled = d.pop("rows_cancelled")

        rows_rewritten = d.pop("rows_rewritten")

        events_removed = d.pop("events_removed")

        outbox_erased = cls(
            rows_cancelled=rows_cancelled,
            rows_rewritten=rows_rewritten,
            events_removed=events_removed,
        )

        outbox_erased.additional_properties = d
        return outbox_erased

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
