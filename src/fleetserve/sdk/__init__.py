"""The Python SDK."""

from .client import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]
