"""The Python SDK."""

from .async_client import AsyncClient
from .client import Client
from .results import Quantized, RerankResult, SparseVector, unpack_bits

__all__ = ["AsyncClient", "Client", "Quantized", "RerankResult", "SparseVector", "unpack_bits"]
