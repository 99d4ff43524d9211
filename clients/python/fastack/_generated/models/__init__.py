"""Contains all the data models used in inputs/outputs"""

from .ack import Ack
from .archives_erased import ArchivesErased
from .batch_ack import BatchAck
from .batch_identify import BatchIdentify
from .batch_identify_traits import BatchIdentifyTraits
from .batch_request import BatchRequest
from .batch_track import BatchTrack
from .batch_track_properties import BatchTrackProperties
from .contact_out import ContactOut
from .contact_out_traits import ContactOutTraits
from .contacts_erased import ContactsErased
from .dependency_out import DependencyOut
from .dependency_state import DependencyState
from .erasure_accepted import ErasureAccepted
from .erasure_certificate import ErasureCertificate
from .erasure_request_body import ErasureRequestBody
from .erasure_request_body_metadata import ErasureRequestBodyMetadata
from .erasure_stores import ErasureStores
from .erasure_verification import ErasureVerification
from .event_out import EventOut
from .event_out_properties import EventOutProperties
from .event_out_traits import EventOutTraits
from .event_type import EventType
from .events_erased import EventsErased
from .events_erased_by_month import EventsErasedByMonth
from .events_page import EventsPage
from .export_accepted import ExportAccepted
from .export_request import ExportRequest
from .export_request_metadata import ExportRequestMetadata
from .exports_erased import ExportsErased
from .health import Health
from .identify_request import IdentifyRequest
from .identify_request_traits import IdentifyRequestTraits
from .identify_type import IdentifyType
from .inbox_erased import InboxErased
from .job_integrity import JobIntegrity
from .job_kind import JobKind
from .job_list import JobList
from .job_out import JobOut
from .job_out_metadata import JobOutMetadata
from .job_protection import JobProtection
from .job_result import JobResult
from .job_state import JobState
from .lake_erased import LakeErased
from .object_erased import ObjectErased
from .outbox_erased import OutboxErased
from .problem import Problem
from .problem_code import ProblemCode
from .problem_field import ProblemField
from .quarantine_erased import QuarantineErased
from .readiness import Readiness
from .readiness_dependencies import ReadinessDependencies
from .schema_violation_out import SchemaViolationOut
from .subject_kind_out import SubjectKindOut
from .subject_out import SubjectOut
from .suppression_lifted import SuppressionLifted
from .suppression_list import SuppressionList
from .suppression_out import SuppressionOut
from .track_request import TrackRequest
from .track_request_properties import TrackRequestProperties
from .track_type import TrackType
from .tracking_plan_out import TrackingPlanOut
from .webhooks_erased import WebhooksErased
from .window_out import WindowOut

__all__ = (
    "Ack",
    "ArchivesErased",
    "BatchAck",
    "BatchIdentify",
    "BatchIdentifyTraits",
    "BatchRequest",
    "BatchTrack",
    "BatchTrackProperties",
    "ContactOut",
    "ContactOutTraits",
    "ContactsErased",
    "DependencyOut",
    "DependencyState",
    "ErasureAccepted",
    "ErasureCertificate",
    "ErasureRequestBody",
    "ErasureRequestBodyMetadata",
    "ErasureStores",
    "ErasureVerification",
    "EventOut",
    "EventOutProperties",
    "EventOutTraits",
    "EventsErased",
    "EventsErasedByMonth",
    "EventsPage",
    "EventType",
    "ExportAccepted",
    "ExportRequest",
    "ExportRequestMetadata",
    "ExportsErased",
    "Health",
    "IdentifyRequest",
    "IdentifyRequestTraits",
    "IdentifyType",
    "InboxErased",
    "JobIntegrity",
    "JobKind",
    "JobList",
    "JobOut",
    "JobOutMetadata",
    "JobProtection",
    "JobResult",
    "JobState",
    "LakeErased",
    "ObjectErased",
    "OutboxErased",
    "Problem",
    "ProblemCode",
    "ProblemField",
    "QuarantineErased",
    "Readiness",
    "ReadinessDependencies",
    "SchemaViolationOut",
    "SubjectKindOut",
    "SubjectOut",
    "SuppressionLifted",
    "SuppressionList",
    "SuppressionOut",
    "TrackingPlanOut",
    "TrackRequest",
    "TrackRequestProperties",
    "TrackType",
    "WebhooksErased",
    "WindowOut",
)
