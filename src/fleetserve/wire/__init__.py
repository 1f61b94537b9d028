"""The leaf vocabulary: ids, enums, request and reply types, codecs and errors.

Nothing here imports any other part of fleetserve.
"""

from .adapter_ids import (
    DEFAULT_TENANT,
    OPEN,
    PUBLIC_TENANT,
    AdapterId,
    Principal,
    Scope,
    parse_adapter_id,
    split_model_name,
)
from .durations import parse_duration
from .errors import (
    ERROR_TYPES,
    AdapterNotFound,
    Cancelled,
    Conflict,
    DeadlineExceeded,
    FleetError,
    Forbidden,
    InternalError,
    InvalidInput,
    ModelNotFound,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    error_from_body,
)
from .types import Encoding, Envelope, OutputDtype, Part, Priority, Reply, Task, parse_priority

__all__ = [
    "DEFAULT_TENANT",
    "ERROR_TYPES",
    "OPEN",
    "PUBLIC_TENANT",
    "AdapterId",
    "AdapterNotFound",
    "Cancelled",
    "Conflict",
    "DeadlineExceeded",
    "Encoding",
    "Envelope",
    "FleetError",
    "Forbidden",
    "InternalError",
    "InvalidInput",
    "ModelNotFound",
    "NotFound",
    "OutputDtype",
    "Overloaded",
    "Part",
    "PayloadTooLarge",
    "Principal",
    "Priority",
    "Reply",
    "Scope",
    "Task",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "error_from_body",
    "parse_adapter_id",
    "parse_duration",
    "parse_priority",
    "split_model_name",
]
