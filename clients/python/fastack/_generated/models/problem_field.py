from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="ProblemField")


@_attrs_define
class ProblemField:
    """One offending field of a request.

    Attributes:
        field (str): Where: a JSON pointer into the request body (`/user_id`,
            `/properties/amount`, `/batch/3/occurred_at`; `""` is the body
            itself), or the name of a query parameter (`from`).
        code (str): Stable reason: `required`, `invalid_type`, `invalid_length`,
            `invalid_timestamp`, `invalid_character`, `invalid_number`,
            `unknown_field`, `occurred_at_in_future`, …
        message (str):
        index (int | Unset): Batch item index, for `/v1/core/batch`.
    """

    field: str
    code: str
    message: str
    index: int | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        field = self.field

        code = self.code

        message = self.message

        index = self.index

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "field": field,
                "code": code,
                "message": message,
            }
        )
        if index is not UNSET:
            field_dict["index"] = index

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        field = d.pop("field")

        code = d.pop("code")

        message = d.pop("message")

        index = d.pop("index", UNSET)

        problem_field = cls(
            field=field,
            code=code,
            message=message,
            index=index,
        )

        problem_field.additional_properties = d
        return problem_field

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
