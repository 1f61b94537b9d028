"""``GET /v1/models`` and ``GET /v1/models/{id}``: OpenAI's list and retrieve, over the
models as this server sees them (``Gateway.models_info``). Ids may hold '/', so the
one model is the rest of the (decoded) path; an id this server does not serve is a 404 that
names the nearest (``Catalog.get``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..catalog import Catalog
from ..wire import NotFound

PREFIX = "/v1/models"


def listing(method: str, path: str) -> str | None:
    """``""`` for the list, the model id for one model, None for any other route."""
    if method != "GET" or not path.startswith(PREFIX):
        return None
    if path == PREFIX:
        return ""
    if path[len(PREFIX)] != "/" or path == PREFIX + "/":
        return None
    return path[len(PREFIX) + 1 :]  # (uvicorn's path is decoded already)


def entries(catalog: Catalog) -> list[dict[str, Any]]:
    """The catalog as the list has it where the server says no more (a bare gateway)."""
    return [
        {"id": s.id, "object": "model", "owned_by": "fleetserve", "family": s.family}
        for s in catalog
    ]


def body(
    model: str,
    entries: list[dict[str, Any]],
    memory: Mapping[str, object] | None,
    catalog: Catalog,
) -> dict[str, object]:
    """The list (``model`` empty, with the fleet's ``memory`` where there is one), or
    the one model's entry as the list has it."""
    if not model:
        out: dict[str, object] = {"object": "list", "data": entries}
        if memory is not None:
            out["memory"] = dict(memory)
        return out
    for entry in entries:
        if entry.get("id") == model:
            return entry
    catalog.get(model)  # a ModelNotFound that names the nearest, where it is not served
    raise NotFound(f"model {model!r} is not listed here", field="model")


__all__ = ["PREFIX", "body", "entries", "listing"]
