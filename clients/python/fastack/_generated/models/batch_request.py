from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.batch_identify import BatchIdentify
    from ..models.batch_track import BatchTrack


T = TypeVar("T", bound="BatchRequest")


@_attrs_define
class BatchRequest:
    """`POST /v1/core/batch`: 1–500 items, all accepted or none. Each item
    follows the rules of its endpoint; in each, one of `user_id` /
    `anonymous_id` is required.
    Ids, keys and names hold no control characters; no string or member
    name holds NUL or a lone surrogate, and numbers must be storable exactly
    (README "Input rules").

        Attributes:
            batch (list[BatchIdentify | BatchTrack]):
    """

    batch: list[BatchIdentify | BatchTrack]

    def to_dict(self) -> dict[str, Any]:
        from ..models.batch_track import BatchTrack  # noqa: PLC0415

        batch = []
        for batch_item_data in self.batch:
            batch_item: dict[str, Any]
            if isinstance(batch_item_data, BatchTrack):
                batch_item = batch_item_data.to_dict()
            else:
                batch_item = batch_item_data.to_dict()

            batch.append(batch_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "batch": batch,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.batch_identify import BatchIdentify  # noqa: PLC0415
        from ..models.batch_track import BatchTrack  # noqa: PLC0415

        d = dict(src_dict)
        batch = []
        _batch = d.pop("batch")
        for batch_item_data in _batch:

            def _parse_batch_item(data: object) -> BatchIdentify | BatchTrack:
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    componentsschemas_batch_item_type_0 = BatchTrack.from_dict(data)

                    return componentsschemas_batch_item_type_0
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                if not isinstance(data, dict):
                    raise TypeError()
                componentsschemas_batch_item_type_1 = BatchIdentify.from_dict(data)

                return componentsschemas_batch_item_type_1

            batch_item = _parse_batch_item(batch_item_data)

            batch.append(batch_item)

        batch_request = cls(
            batch=batch,
        )

        return batch_request
