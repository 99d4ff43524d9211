from enum import Enum


class ProblemCode(str, Enum):
    BATCH_TOO_LARGE = "batch_too_large"
    CONFLICT = "conflict"
    IDEMPOTENCY_KEY_CONFLICT = "idempotency_key_conflict"
    INTERNAL = "internal"
    INVALID_ENCODING = "invalid_encoding"
    INVALID_ENDPOINT = "invalid_endpoint"
    INVALID_JSON = "invalid_json"
    INVALID_PAYLOAD = "invalid_payload"
    INVALID_PLAN = "invalid_plan"
    INVALID_QUERY = "invalid_query"
    INVALID_REQUEST = "invalid_request"
    INVALID_SIGNATURE = "invalid_signature"
    JOB_NOT_COMPLETED = "job_not_completed"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_FOUND = "not_found"
    OCCURRED_AT_IN_FUTURE = "occurred_at_in_future"
    OCCURRED_AT_OUT_OF_RETENTION = "occurred_at_out_of_retention"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    RATE_LIMITED = "rate_limited"
    REQUEST_TIMEOUT = "request_timeout"
    SCHEMA_VIOLATION = "schema_violation"
    UNAUTHORIZED = "unauthorized"
    UNAVAILABLE = "unavailable"
    UNPLANNED_EVENT = "unplanned_event"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"

    def __str__(self) -> str:
        return str(self.value)
