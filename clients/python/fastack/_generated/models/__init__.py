"""Contains all the data models used in inputs/outputs"""

from .ack import Ack
from .batch_ack import BatchAck
from .batch_item import BatchItem
from .batch_item_properties import BatchItemProperties
from .batch_item_traits import BatchItemTraits
from .batch_request import BatchRequest
from .contact_out import ContactOut
from .contact_out_traits import ContactOutTraits
from .event_out import EventOut
from .event_out_properties import EventOutProperties
from .event_out_traits import EventOutTraits
from .event_type import EventType
from .events_page import EventsPage
from .export_accepted import ExportAccepted
from .export_request import ExportRequest
from .export_request_metadata import ExportRequestMetadata
from .health import Health
from .identify_request import IdentifyRequest
from .identify_request_traits import IdentifyRequestTraits
from .job_integrity import JobIntegrity
from .job_kind import JobKind
from .job_list import JobList
from .job_out import JobOut
from .job_out_metadata import JobOutMetadata
from .job_protection import JobProtection
from .job_result import JobResult
from .job_state import JobState
from .problem import Problem
from .problem_code import ProblemCode
from .problem_field import ProblemField
from .schema_violation_out import SchemaViolationOut
from .track_request import TrackRequest
from .track_request_properties import TrackRequestProperties
from .tracking_plan_out import TrackingPlanOut

__all__ = (
    "Ack",
    "BatchAck",
    "BatchItem",
    "BatchItemProperties",
    "BatchItemTraits",
    "BatchRequest",
    "ContactOut",
    "ContactOutTraits",
    "EventOut",
    "EventOutProperties",
    "EventOutTraits",
    "EventsPage",
    "EventType",
    "ExportAccepted",
    "ExportRequest",
    "ExportRequestMetadata",
    "Health",
    "IdentifyRequest",
    "IdentifyRequestTraits",
    "JobIntegrity",
    "JobKind",
    "JobList",
    "JobOut",
    "JobOutMetadata",
    "JobProtection",
    "JobResult",
    "JobState",
    "Problem",
    "ProblemCode",
    "ProblemField",
    "SchemaViolationOut",
    "TrackingPlanOut",
    "TrackRequest",
    "TrackRequestProperties",
)
