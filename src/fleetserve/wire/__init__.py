"""The leaf vocabulary: ids, enums, request and reply types, codecs and errors.

Nothing here imports any other part of fleetserve.
"""

from .durations import parse_duration
from .errors import (
    ERROR_TYPES,
    DeadlineExceeded,
    FleetError,
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
from .types import Encoding, Envelope, OutputDtype, Reply, Task

__all__ = [
    "ERROR_TYPES",
    "DeadlineExceeded",
    "Encoding",
    "Envelope",
    "FleetError",
    "InternalError",
    "InvalidInput",
    "ModelNotFound",
    "NotFound",
    "OutputDtype",
    "Overloaded",
    "PayloadTooLarge",
    "Reply",
    "Task",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "error_from_body",
    "parse_duration",
]
