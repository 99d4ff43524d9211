from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.events_erased_by_month import EventsErasedByMonth


T = TypeVar("T", bound="EventsErased")


@_attrs_define
class EventsErased:
    """
    Attributes:
        events_removed (int):
        by_month (EventsErasedByMonth): `YYYY-MM` → events removed from that month's partition.
    """

    events_removed: int
    by_month: EventsErasedByMonth
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        events_removed = self.events_removed

        by_month = self.by_month.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "events_removed": events_removed,
                "by_month": by_month,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.events_erased_by_month import EventsErasedByMonth  # noqa: PLC0415

        d = dict(src_dict)
        events_removed = d.pop("events_removed")

        by_month = EventsErasedByMonth.from_dict(d.pop("by_month"))

        events_erased = cls(
            events_removed=events_removed,
            by_month=by_month,
        )

        events_erased.additional_properties = d
        return events_erased

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
