from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.erasure_stores import ErasureStores
    from ..models.erasure_verification import ErasureVerification
    from ..models.job_integrity import JobIntegrity
    from ..models.subject_out import SubjectOut
    from ..models.window_out import WindowOut


T = TypeVar("T", bound="ErasureCertificate")


@_attrs_define
class ErasureCertificate:
    """The result of a completed erasure: a certificate of what was removed and
    of the verification pass, signed with HMAC-SHA256 under the tenant's
    external HMAC key (`fastack keys external-hmac --tenant …`) over the
    certificate's JSON without `hmac` and `integrity`, keys sorted, no
    whitespace.

        Attributes:
            request_id (UUID):
            tenant_id (UUID):
            subjects (list[SubjectOut]): Every identifier erased, hashed.
            suppressed (bool):
            stores (ErasureStores): What was removed, store by store: `archives` are retention archives
                rewritten (their new manifest verified before the old object was
                replaced), `exports` stored export results rewritten (their job's result
                names the erasure in `erasures`), `lake` the Parquet lake (absent when
                the mirror is off).
            verification (ErasureVerification): The verification pass: every store looked at again after the work.
            hmac (str):
            integrity (JobIntegrity):
            window (WindowOut | Unset): The window of an erasure.
    """

    request_id: UUID
    tenant_id: UUID
    subjects: list[SubjectOut]
    suppressed: bool
    stores: ErasureStores
    verification: ErasureVerification
    hmac: str
    integrity: JobIntegrity
    window: WindowOut | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        request_id = str(self.request_id)

        tenant_id = str(self.tenant_id)

        subjects = []
        for subjects_item_data in self.subjects:
            subjects_item = subjects_item_data.to_dict()
            subjects.append(subjects_item)

        suppressed = self.suppressed

        stores = self.stores.to_dict()

        verification = self.verification.to_dict()

        hmac = self.hmac

        integrity = self.integrity.to_dict()

        window: dict[str, Any] | Unset = UNSET
        if not isinstance(self.window, Unset):
            window = self.window.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "request_id": request_id,
                "tenant_id": tenant_id,
                "subjects": subjects,
                "suppressed": suppressed,
                "stores": stores,
                "verification": verification,
                "hmac": hmac,
                "integrity": integrity,
            }
        )
        if window is not UNSET:
            field_dict["window"] = window

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.erasure_stores import ErasureStores  # noqa: PLC0415
        from ..models.erasure_verification import ErasureVerification  # noqa: PLC0415
        from ..models.job_integrity import JobIntegrity  # noqa: PLC0415
        from ..models.subject_out import SubjectOut  # noqa: PLC0415
        from ..models.window_out import WindowOut  # noqa: PLC0415

        d = dict(src_dict)
        request_id = UUID(d.pop("request_id"))

        tenant_id = UUID(d.pop("tenant_id"))

        subjects = []
        _subjects = d.pop("subjects")
        for subjects_item_data in _subjects:
            subjects_item = SubjectOut.from_dict(subjects_item_data)

            subjects.append(subjects_item)

        suppressed = d.pop("suppressed")

        stores = ErasureStores.from_dict(d.pop("stores"))

        verification = ErasureVerification.from_dict(d.pop("verification"))

        hmac = d.pop("hmac")

        integrity = JobIntegrity.from_dict(d.pop("integrity"))

        _window = d.pop("window", UNSET)
        window: WindowOut | Unset
        if isinstance(_window, Unset):
            window = UNSET
        else:
            window = WindowOut.from_dict(_window)

        erasure_certificate = cls(
            request_id=request_id,
            tenant_id=tenant_id,
            subjects=subjects,
            suppressed=suppressed,
            stores=stores,
            verification=verification,
            hmac=hmac,
            integrity=integrity,
            window=window,
        )

        erasure_certificate.additional_properties = d
        return erasure_certificate

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
