"""The Python SDK."""

from ._job_wait import FineTuningFailed
from .async_client import AsyncClient
from .client import Client
from .results import Quantized, RerankResult, SparseVector, unpack_bits

__all__ = [
    "AsyncClient",
    "Client",
    "FineTuningFailed",
    "Quantized",
    "RerankResult",
    "SparseVector",
    "unpack_bits",
]
