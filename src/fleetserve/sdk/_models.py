"""The SDK's model calls (``POST /v1/models``, ``DELETE /v1/models/{id}``), shared by
the sync and async clients: add a model to a running server, or remove one (admin)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..wire import Encoding
from ..wire.codec import dumps
from ._adapters import Request

PATH = "/v1/models"


def _entry(reply: Any) -> dict[str, Any]:
    return dict(reply)


def add(spec: Mapping[str, object]) -> Request[dict[str, Any]]:
    """``spec``: a catalog spec's fields (``id``, ``sources``, ``family``...), or
    ``{"source": ...}`` alone for the server to infer them."""
    return Request("POST", PATH, _entry, content=dumps(dict(spec), Encoding.MSGPACK))


def remove(model: str) -> Request[dict[str, Any]]:
    return Request("DELETE", f"{PATH}/{quote(model, safe='/')}", _entry)
