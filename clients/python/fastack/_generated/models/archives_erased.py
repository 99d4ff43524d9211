from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.object_erased import ObjectErased


T = TypeVar("T", bound="ArchivesErased")


@_attrs_define
class ArchivesErased:
    """
    Attributes:
        objects_rewritten (int):
        events_removed (int):
        objects (list[ObjectErased]):
    """

    objects_rewritten: int
    events_removed: int
    objects: list[ObjectErased]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        objects_rewritten = self.objects_rewritten

        events_removed = self.events_removed

        objects = []
        for objects_item_data in self.objects:
            objects_item = objects_item_data.to_dict()
            objects.append(objects_item)

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "objects_rewritten": objects_rewritten,
                "events_removed": events_removed,
                "objects": objects,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.object_erased import ObjectErased  # noqa: PLC0415

        d = dict(src_dict)
        objects_rewritten = d.pop("objects_rewritten")

        events_removed = d.pop("events_removed")

        objects = []
        _objects = d.pop("objects")
        for objects_item_data in _objects:
            objects_item = ObjectErased.from_dict(objects_item_data)

            objects.append(objects_item)

        archives_erased = cls(
            objects_rewritten=objects_rewritten,
            events_removed=events_removed,
            objects=objects,
        )

        archives_erased.additional_properties = d
        return archives_erased

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
