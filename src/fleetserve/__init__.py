"""fleetserve: serve fleets of small open models on hardware you own."""

from .sdk import AsyncClient, Client, FineTuningFailed
from .wire import (
    AdapterNotFound,
    Conflict,
    DeadlineExceeded,
    FleetError,
    Forbidden,
    InternalError,
    InvalidInput,
    ModelNotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "AdapterNotFound",
    "AsyncClient",
    "Client",
    "Conflict",
    "DeadlineExceeded",
    "FineTuningFailed",
    "FleetError",
    "Forbidden",
    "InternalError",
    "InvalidInput",
    "ModelNotFound",
    "Overloaded",
    "PayloadTooLarge",
    "Unauthorized",
    "Unavailable",
    "__version__",
]
