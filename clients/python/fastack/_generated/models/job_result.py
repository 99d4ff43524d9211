from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.job_integrity import JobIntegrity
    from ..models.job_protection import JobProtection


T = TypeVar("T", bound="JobResult")


@_attrs_define
class JobResult:
    """The result of a completed export (sizes describe the plaintext).

    Attributes:
        path (str): Object key: `exports/<tenant>/<job_id>.ndjson`.
        size_bytes (int):
        row_count (int):
        format_ (str): `ndjson`
        hmac (str): HMAC-SHA256 of the plaintext with the tenant's external HMAC key
            (`fastack keys external-hmac --tenant …`).
        integrity (JobIntegrity):
        protection (JobProtection):
    """

    path: str
    size_bytes: int
    row_count: int
    format_: str
    hmac: str
    integrity: JobIntegrity
    protection: JobProtection
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        path = self.path

        size_bytes = self.size_bytes

        row_count = self.row_count

        format_ = self.format_

        hmac = self.hmac

        integrity = self.integrity.to_dict()

        protection = self.protection.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "path": path,
                "size_bytes": size_bytes,
                "row_count": row_count,
                "format": format_,
                "hmac": hmac,
                "integrity": integrity,
                "protection": protection,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.job_integrity import JobIntegrity  # noqa: PLC0415
        from ..models.job_protection import JobProtection  # noqa: PLC0415

        d = dict(src_dict)
        path = d.pop("path")

        size_bytes = d.pop("size_bytes")

        row_count = d.pop("row_count")

        format_ = d.pop("format")

        hmac = d.pop("hmac")

        integrity = JobIntegrity.from_dict(d.pop("integrity"))

        protection = JobProtection.from_dict(d.pop("protection"))

        job_result = cls(
            path=path,
            size_bytes=size_bytes,
            row_count=row_count,
            format_=format_,
            hmac=hmac,
            integrity=integrity,
            protection=protection,
        )

        job_result.additional_properties = d
        return job_result

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
