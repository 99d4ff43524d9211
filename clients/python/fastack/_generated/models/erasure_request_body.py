from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define

from .. import types
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.erasure_request_body_metadata import ErasureRequestBodyMetadata


T = TypeVar("T", bound="ErasureRequestBody")


@_attrs_define
class ErasureRequestBody:
    """`POST /v1/core/erasures`. Name people by any of their identifiers: 1 to
    5,000 identifiers in all across `user_ids`, `anonymous_ids` and
    `contact_ids` (more is `422 invalid_payload`, code
    `too_many_identifiers`). Each resolves to its contact (merges followed)
    and every identifier linked to it. Ids hold no control characters. No
    string or member name in
    `metadata` holds NUL or a lone surrogate, and numbers must be storable
    exactly.

        Attributes:
            user_ids (list[str] | Unset): User ids (each 1–255 characters).
            anonymous_ids (list[str] | Unset): Anonymous ids (each 1–255 characters).
            contact_ids (list[UUID] | Unset): Contact ids (UUIDs).
            suppress (bool | Unset): Also drop the people's future events (a suppression per identifier,
                until lifted with `DELETE /v1/core/suppressions`). Default false.
            from_ (datetime.datetime | Unset): Erase only events with `occurred_at` at or after this instant (RFC
                3339); with `from` or `to` the contact and its identities stay.
            to (datetime.datetime | Unset): Erase only events with `occurred_at` before this instant; after
                `from` when both are given.
            metadata (ErasureRequestBodyMetadata | Unset): Copied to the job and its terminal event; `error` is reserved for
                failures (at most 16 KiB).
    """

    user_ids: list[str] | Unset = UNSET
    anonymous_ids: list[str] | Unset = UNSET
    contact_ids: list[UUID] | Unset = UNSET
    suppress: bool | Unset = UNSET
    from_: datetime.datetime | Unset = UNSET
    to: datetime.datetime | Unset = UNSET
    metadata: ErasureRequestBodyMetadata | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        user_ids: list[str] | Unset = UNSET
        if not isinstance(self.user_ids, Unset):
            user_ids = self.user_ids

        anonymous_ids: list[str] | Unset = UNSET
        if not isinstance(self.anonymous_ids, Unset):
            anonymous_ids = self.anonymous_ids

        contact_ids: list[str] | Unset = UNSET
        if not isinstance(self.contact_ids, Unset):
            contact_ids = []
            for contact_ids_item_data in self.contact_ids:
                contact_ids_item = str(contact_ids_item_data)
                contact_ids.append(contact_ids_item)

        suppress = self.suppress

        from_: str | Unset = UNSET
        if not isinstance(self.from_, Unset):
            from_ = self.from_.isoformat()

        to: str | Unset = UNSET
        if not isinstance(self.to, Unset):
            to = self.to.isoformat()

        metadata: dict[str, Any] | Unset = UNSET
        if not isinstance(self.metadata, Unset):
            metadata = self.metadata.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if user_ids is not UNSET:
            field_dict["user_ids"] = user_ids
        if anonymous_ids is not UNSET:
            field_dict["anonymous_ids"] = anonymous_ids
        if contact_ids is not UNSET:
            field_dict["contact_ids"] = contact_ids
        if suppress is not UNSET:
            field_dict["suppress"] = suppress
        if from_ is not UNSET:
            field_dict["from"] = from_
        if to is not UNSET:
            field_dict["to"] = to
        if metadata is not UNSET:
            field_dict["metadata"] = metadata

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.erasure_request_body_metadata import ErasureRequestBodyMetadata  # noqa: PLC0415

        d = dict(src_dict)
        user_ids = cast(list[str], d.pop("user_ids", UNSET))

        anonymous_ids = cast(list[str], d.pop("anonymous_ids", UNSET))

        _contact_ids = d.pop("contact_ids", UNSET)
        contact_ids: list[UUID] | Unset = UNSET
        if _contact_ids is not UNSET:
            contact_ids = []
            for contact_ids_item_data in _contact_ids:
                contact_ids_item = UUID(contact_ids_item_data)

                contact_ids.append(contact_ids_item)

        suppress = d.pop("suppress", UNSET)

        _from_ = d.pop("from", UNSET)
        from_: datetime.datetime | Unset
        if isinstance(_from_, Unset):
            from_ = UNSET
        else:
            from_ = types.parse_datetime(_from_)

        _to = d.pop("to", UNSET)
        to: datetime.datetime | Unset
        if isinstance(_to, Unset):
            to = UNSET
        else:
            to = types.parse_datetime(_to)

        _metadata = d.pop("metadata", UNSET)
        metadata: ErasureRequestBodyMetadata | Unset
        if isinstance(_metadata, Unset):
            metadata = UNSET
        else:
            metadata = ErasureRequestBodyMetadata.from_dict(_metadata)

        erasure_request_body = cls(
            user_ids=user_ids,
            anonymous_ids=anonymous_ids,
            contact_ids=contact_ids,
            suppress=suppress,
            from_=from_,
            to=to,
            metadata=metadata,
        )

        return erasure_request_body
