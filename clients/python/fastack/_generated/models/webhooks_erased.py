from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="WebhooksErased")


@_attrs_define
class WebhooksErased:
    """
    Attributes:
        deliveries_cancelled (int): Pending deliveries of the people's events that will not be sent.
        payloads_scrubbed (int): Deliveries whose stored payload was removed (the attempts stay).
    """

    deliveries_cancelled: int
    payloads_scrubbed: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        deliveries_cancelled = self.deliveries_cancelled

        payloads_scrubbed = self.payloads_scrubbed

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "deliveries_cancelled": deliveries_cancelled,
                "payloads_scrubbed": payloads_scrubbed,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        deliveries_cancelled = d.pop("deliveries_cancelled")

        payloads_scrubbed = d.pop("payloads_scrubbed")

        webhooks_erased = cls(
            deliveries_cancelled=deliveries_cancelled,
            payloads_scrubbed=payloads_scrubbed,
        )

        webhooks_erased.additional_properties = d
        return webhooks_erased

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
