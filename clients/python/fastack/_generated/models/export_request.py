from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from .. import types
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.export_request_metadata import ExportRequestMetadata


T = TypeVar("T", bound="ExportRequest")


@_attrs_define
class ExportRequest:
    """`POST /v1/core/exports`. No string or member name in `metadata` holds
    NUL or a lone surrogate, and numbers must be storable exactly.

        Attributes:
            from_ (datetime.datetime): Inclusive lower bound of `occurred_at` (RFC 3339).
            to (datetime.datetime): Exclusive upper bound of `occurred_at`.
            event (str | Unset): Only events with this name (1–200 characters; omit it for every
                event).
            metadata (ExportRequestMetadata | Unset): Copied to the job and its terminal event (e.g. `source`,
                `correlationId`); `error` is reserved for failures.
    """

    from_: datetime.datetime
    to: datetime.datetime
    event: str | Unset = UNSET
    metadata: ExportRequestMetadata | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from_ = self.from_.isoformat()

        to = self.to.isoformat()

        event = self.event

        metadata: dict[str, Any] | Unset = UNSET
        if not isinstance(self.metadata, Unset):
            metadata = self.metadata.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "from": from_,
                "to": to,
            }
        )
        if event is not UNSET:
            field_dict["event"] = event
        if metadata is not UNSET:
            field_dict["metadata"] = metadata

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.export_request_metadata import ExportRequestMetadata  # noqa: PLC0415

        d = dict(src_dict)
        from_ = types.parse_datetime(d.pop("from"))

        to = types.parse_datetime(d.pop("to"))

        event = d.pop("event", UNSET)

        _metadata = d.pop("metadata", UNSET)
        metadata: ExportRequestMetadata | Unset
        if isinstance(_metadata, Unset):
            metadata = UNSET
        else:
            metadata = ExportRequestMetadata.from_dict(_metadata)

        export_request = cls(
            from_=from_,
            to=to,
            event=event,
            metadata=metadata,
        )

        return export_request
