"""The gateway: ASGI app, envelopes, reply waiting and the HTTP error mapping."""

from .app import Gateway

__all__ = ["Gateway"]
