from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from .. import types
from ..models.job_kind import JobKind
from ..models.job_state import JobState
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.erasure_certificate import ErasureCertificate
    from ..models.job_out_metadata import JobOutMetadata
    from ..models.job_result import JobResult


T = TypeVar("T", bound="JobOut")


@_attrs_define
class JobOut:
    """A job. A failed job has no `result` and no `completed_at`; its
    `metadata.error.message` says why (addresses redacted).

        Attributes:
            job_id (UUID):
            kind (JobKind): What a job does: an `export` or an `erasure` requested through this
                API, or a `retention` archive of a partition (the operator's).
            status (JobState): A job's state (and the `status` filter of the job list).
            metadata (JobOutMetadata):
            created_at (datetime.datetime):
            result (ErasureCertificate | JobResult | Unset): A completed job's result: an export's object, or an erasure's
                certificate.
            execution_time_ms (int | Unset):
            completed_at (datetime.datetime | Unset):
    """

    job_id: UUID
    kind: JobKind
    status: JobState
    metadata: JobOutMetadata
    created_at: datetime.datetime
    result: ErasureCertificate | JobResult | Unset = UNSET
    execution_time_ms: int | Unset = UNSET
    completed_at: datetime.datetime | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.job_result import JobResult  # noqa: PLC0415

        job_id = str(self.job_id)

        kind = self.kind.value

        status = self.status.value

        metadata = self.metadata.to_dict()

        created_at = self.created_at.isoformat()

        result: dict[str, Any] | Unset
        if isinstance(self.result, Unset):
            result = UNSET
        elif isinstance(self.result, JobResult):
            result = self.result.to_dict()
        else:
            result = self.result.to_dict()

        execution_time_ms = self.execution_time_ms

        completed_at: str | Unset = UNSET
        if not isinstance(self.completed_at, Unset):
            completed_at = self.completed_at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "job_id": job_id,
                "kind": kind,
                "status": status,
                "metadata": metadata,
                "created_at": created_at,
            }
        )
        if result is not UNSET:
            field_dict["result"] = result
        if execution_time_ms is not UNSET:
            field_dict["execution_time_ms"] = execution_time_ms
        if completed_at is not UNSET:
            field_dict["completed_at"] = completed_at

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.erasure_certificate import ErasureCertificate  # noqa: PLC0415
        from ..models.job_out_metadata import JobOutMetadata  # noqa: PLC0415
        from ..models.job_result import JobResult  # noqa: PLC0415

        d = dict(src_dict)
        job_id = UUID(d.pop("job_id"))

        kind = JobKind(d.pop("kind"))

        status = JobState(d.pop("status"))

        metadata = JobOutMetadata.from_dict(d.pop("metadata"))

        created_at = types.parse_datetime(d.pop("created_at"))

        def _parse_result(data: object) -> ErasureCertificate | JobResult | Unset:
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                componentsschemas_job_result_out_type_0 = JobResult.from_dict(data)

                return componentsschemas_job_result_out_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            componentsschemas_job_result_out_type_1 = ErasureCertificate.from_dict(data)

            return componentsschemas_job_result_out_type_1

        result = _parse_result(d.pop("result", UNSET))

        execution_time_ms = d.pop("execution_time_ms", UNSET)

        _completed_at = d.pop("completed_at", UNSET)
        completed_at: datetime.datetime | Unset
        if isinstance(_completed_at, Unset):
            completed_at = UNSET
        else:
            completed_at = types.parse_datetime(_completed_at)

        job_out = cls(
            job_id=job_id,
            kind=kind,
            status=status,
            metadata=metadata,
            created_at=created_at,
            result=result,
            execution_time_ms=execution_time_ms,
            completed_at=completed_at,
        )

        job_out.additional_properties = d
        return job_out

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
