from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.object_erased import ObjectErased


T = TypeVar("T", bound="ExportsErased")


@_attrs_define
class ExportsErased:
    """
    Attributes:
        results_rewritten (int):
        events_removed (int):
        jobs (list[ObjectErased]):
    """

    results_rewritten: int
    events_removed: int
    jobs: list[ObjectErased]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        results_rewritten = self.results_rewritten

        events_removed = self.events_removed

        jobs = []
        for jobs_item_data in self.jobs:
            jobs_item = jobs_item_data.to_dict()
            jobs.append(jobs_item)

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "results_rewritten": results_rewritten,
                "events_removed": events_removed,
                "jobs": jobs,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.object_erased import ObjectErased  # noqa: PLC0415

        d = dict(src_dict)
        results_rewritten = d.pop("results_rewritten")

        events_removed = d.pop("events_removed")

        jobs = []
        _jobs = d.pop("jobs")
        for jobs_item_data in _jobs:
            jobs_item = ObjectErased.from_dict(jobs_item_data)

            jobs.append(jobs_item)

        exports_erased = cls(
            results_rewritten=results_rewritten,
            events_removed=events_removed,
            jobs=jobs,
        )

        exports_erased.additional_properties = d
        return exports_erased

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
