from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from .. import types
from ..models.dependency_state import DependencyState
from ..types import UNSET, Unset

T = TypeVar("T", bound="DependencyOut")


@_attrs_define
class DependencyOut:
    """One dependency of the node, as last checked.

    Attributes:
        state (DependencyState): A dependency's state: `warning` works with something to know (nothing
            bound to an exchange, a disk running low).
        since (datetime.datetime): When it entered this state.
        checked_at (datetime.datetime):
        detail (str | Unset): What it is: where (no credentials), free bytes.
        last_error (str | Unset): The last failure or warning, kept after it recovers.
    """

    state: DependencyState
    since: datetime.datetime
    checked_at: datetime.datetime
    detail: str | Unset = UNSET
    last_error: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        state = self.state.value

        since = self.since.isoformat()

        checked_at = self.checked_at.isoformat()

        detail = self.detail

        last_error = self.last_error

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "state": state,
                "since": since,
                "checked_at": checked_at,
            }
        )
        if detail is not UNSET:
            field_dict["detail"] = detail
        if last_error is not UNSET:
            field_dict["last_error"] = last_error

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        state = DependencyState(d.pop("state"))

        since = types.parse_datetime(d.pop("since"))

        checked_at = types.parse_datetime(d.pop("checked_at"))

        detail = d.pop("detail", UNSET)

        last_error = d.pop("last_error", UNSET)

        dependency_out = cls(
            state=state,
            since=since,
            checked_at=checked_at,
            detail=detail,
            last_error=last_error,
        )

        dependency_out.additional_properties = d
        return dependency_out

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
