from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from .. import types
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.identify_request_traits import IdentifyRequestTraits


T = TypeVar("T", bound="IdentifyRequest")


@_attrs_define
class IdentifyRequest:
    """`POST /v1/core/identify`. One of `user_id` / `anonymous_id` is
    required; with both, links them (merging contacts).
    Ids, keys and names hold no control characters; no string or member
    name holds NUL or a lone surrogate, and numbers must be storable exactly
    (README "Input rules").

        Attributes:
            occurred_at (datetime.datetime): When it happened, RFC 3339 with offset; at most 24 h in the future and
                inside the tenant's retention.
            idempotency_key (str): Unique per tenant across track, identify and batch (1–255
                characters).
            user_id (str | Unset): Your stable user id (1–255 characters).
            anonymous_id (str | Unset): A device or session id (1–255 characters).
            traits (IdentifyRequestTraits | Unset): Traits merged into the contact (shallow, last write wins).
            sent_at (datetime.datetime | Unset): When the client sent it (not part of the idempotency comparison).
    """

    occurred_at: datetime.datetime
    idempotency_key: str
    user_id: str | Unset = UNSET
    anonymous_id: str | Unset = UNSET
    traits: IdentifyRequestTraits | Unset = UNSET
    sent_at: datetime.datetime | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
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
        from ..models.identify_request_traits import IdentifyRequestTraits  # noqa: PLC0415

        d = dict(src_dict)
        occurred_at = types.parse_datetime(d.pop("occurred_at"))

        idempotency_key = d.pop("idempotency_key")

        user_id = d.pop("user_id", UNSET)

        anonymous_id = d.pop("anonymous_id", UNSET)

        _traits = d.pop("traits", UNSET)
        traits: IdentifyRequestTraits | Unset
        if isinstance(_traits, Unset):
            traits = UNSET
        else:
            traits = IdentifyRequestTraits.from_dict(_traits)

        _sent_at = d.pop("sent_at", UNSET)
        sent_at: datetime.datetime | Unset
        if isinstance(_sent_at, Unset):
            sent_at = UNSET
        else:
            sent_at = types.parse_datetime(_sent_at)

        identify_request = cls(
            occurred_at=occurred_at,
            idempotency_key=idempotency_key,
            user_id=user_id,
            anonymous_id=anonymous_id,
            traits=traits,
            sent_at=sent_at,
        )

        return identify_request
