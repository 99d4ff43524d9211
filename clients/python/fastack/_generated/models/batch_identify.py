from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from .. import types
from ..models.identify_type import IdentifyType
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.batch_identify_traits import BatchIdentifyTraits


T = TypeVar("T", bound="BatchIdentify")


@_attrs_define
class BatchIdentify:
    """An `identify` in a batch: the fields of `POST /v1/core/identify` and
    `type`.

        Attributes:
            type_ (IdentifyType): The `type` of a batch `identify`.
            occurred_at (datetime.datetime): When it happened, RFC 3339 with offset; at most 24 h in the future and
                inside the tenant's retention.
            idempotency_key (str): 1–255 characters, unique per tenant.
            user_id (str | Unset): 1–255 characters; one of `user_id` / `anonymous_id` is required.
            anonymous_id (str | Unset): 1–255 characters.
            traits (BatchIdentifyTraits | Unset): Traits merged into the contact (shallow, last write wins).
            sent_at (datetime.datetime | Unset):
    """

    type_: IdentifyType
    occurred_at: datetime.datetime
    idempotency_key: str
    user_id: str | Unset = UNSET
    anonymous_id: str | Unset = UNSET
    traits: BatchIdentifyTraits | Unset = UNSET
    sent_at: datetime.datetime | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        type_ = self.type_.value

        occurred_at = self.occurred_at.isoformat()

        idempotency_key = self.idempotency_key

        user_id = self.user_id

        anonymous_id = self.anonymous_id

        traits: dict[str, Any] | Unset = UNSET
        if not isinstance(self.traits, Unset):
            traits = self.traits.to_dict()

        sent_at: str | Unset = UNSET
        if not isinstance(self.sent_at, Unset):
            sent_at = self.sent_at.isoformat()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "type": type_,
                "occurred_at": occurred_at,
                "idempotency_key": idempotency_key,
            }
        )
        if user_id is not UNSET:
            field_dict["user_id"] = user_id
        if anonymous_id is not UNSET:
            field_dict["anonymous_id"] = anonymous_id
        if traits is not UNSET:
            field_dict["traits"] = traits
        if sent_at is not UNSET:
            field_dict["sent_at"] = sent_at

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.batch_identify_traits import BatchIdentifyTraits  # noqa: PLC0415

        d = dict(src_dict)
        type_ = IdentifyType(d.pop("type"))

        occurred_at = types.parse_datetime(d.pop("occurred_at"))

        idempotency_key = d.pop("idempotency_key")

        user_id = d.pop("user_id", UNSET)

        anonymous_id = d.pop("anonymous_id", UNSET)

        _traits = d.pop("traits", UNSET)
        traits: BatchIdentifyTraits | Unset
        if isinstance(_traits, Unset):
            traits = UNSET
        else:
            traits = BatchIdentifyTraits.from_dict(_traits)

        _sent_at = d.pop("sent_at", UNSET)
        sent_at: datetime.datetime | Unset
        if isinstance(_sent_at, Unset):
            sent_at = UNSET
        else:
            sent_at = types.parse_datetime(_sent_at)

        batch_identify = cls(
            type_=type_,
            occurred_at=occurred_at,
            idempotency_key=idempotency_key,
            user_id=user_id,
            anonymous_id=anonymous_id,
            traits=traits,
            sent_at=sent_at,
        )

        return batch_identify
