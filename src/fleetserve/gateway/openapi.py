"""``GET /openapi.json``: the OpenAPI 3.1 document of this server's routes.

Generated, not written: the route table (``openapi_routes``) names the request and
reply types, and every schema comes from those types through
``msgspec.json.schema_components`` (the request types are the Structs the server
decodes with). Routes that a server lacks (no adapter registry, no fine-tuning) are
left out, and each dashboard view contributes its own routes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from .. import __version__
from .errors import STATUS
from .openapi_routes import (
    ADAPTERS,
    DASHBOARD,
    FINETUNE,
    INFERENCE,
    MODELS,
    SERVICE,
    Bodies,
    Op,
    view_ops,
)
from .openapi_types import ErrorBody

REF = "#/components/schemas/{name}"
KEYED = frozenset({"/metrics", "/openapi.json"})  # outside /v1/, but keyed like it
REASONS = {
    200: "OK",
    201: "Created",
    304: "Not modified",
    400: "Invalid input",
    401: "Missing or unknown API key",
    403: "The key lacks the scope this call needs",
    404: "No such route, model, adapter or object",
    409: "Conflict: it exists already, or is being created",
    413: "Payload too large",
    415: "Unsupported media type",
    429: "Overloaded: retry after Retry-After seconds",
    500: "Internal error",
    503: "Unavailable (not ready, or the queue is down): retry after Retry-After seconds",
    504: "The deadline passed before a reply",
}
_ERROR_MEDIA = ("application/json", "application/msgpack")


def operations(
    *,
    adapters: bool = True,
    finetune: bool = True,
    views: Iterable[tuple[str, str]] = (),
    models: bool = True,
) -> list[Op]:
    """The routes of a server: with or without adapters, fine-tuning and hot model
    changes (``models``), and the dashboard views given as ``(prefix, name)``."""
    ops = [*SERVICE, *(MODELS if models else ()), *INFERENCE, *DASHBOARD]
    for prefix, name in views:
        ops.extend(view_ops(prefix, name))
    if adapters:
        ops.extend(ADAPTERS)
    if finetune:
        ops.extend(FINETUNE)
    return ops


def document(ops: Sequence[Op]) -> dict[str, object]:
    """The OpenAPI 3.1 document of ``ops``."""
    types = _types(ops)
    refs, components = msgspec.json.schema_components(
        types, ref_template=REF, schema_hook=_schema_hook
    )
    schema_of = dict(zip(types, refs, strict=True))
    paths: dict[str, dict[str, object]] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method] = _operation(op, schema_of)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fleetserve",
            "version": __version__,
            "description": "One API for a fleet of small open models. Bodies are JSON or "
            "msgpack (Content-Type and Accept); errors are always "
            '{"error": {"code", "message", "field"}}.',
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


class Cache:
    """The encoded document per set of routes (a server's routes change only when its
    optional parts come up at start)."""

    def __init__(self) -> None:
        self._docs: dict[tuple[tuple[str, str], ...], bytes] = {}

    def get(self, ops: Sequence[Op]) -> bytes:
        """The document of ``ops`` (``operations``: the routes a gateway serves now)."""
        key = tuple((op.method, op.path) for op in ops)
        if key not in self._docs:
            self._docs[key] = msgspec.json.encode(document(ops))
        return self._docs[key]


# -- pieces ------------------------------------------------------------------------------


def _schema_hook(typ: type) -> dict[str, object]:
    if typ is object:  # e.g. a JSON Schema inside response_format: any value
        return {"description": "any JSON value"}
    raise NotImplementedError


def _types(ops: Sequence[Op]) -> list[object]:
    seen: list[object] = [ErrorBody]
    for op in ops:
        bodies: list[Bodies] = [op.reply, *op.extra.values()]
        if op.request is not None:
            bodies.append(op.request)
        for body in bodies:
            for typ in body.values():
                for one in typ if isinstance(typ, tuple) else (typ,):
                    if one not in seen:
                        seen.append(one)
    return seen


def _schema(typ: object, schema_of: dict[object, dict[str, object]]) -> dict[str, object]:
    if isinstance(typ, tuple):
        return {"anyOf": [schema_of[one] for one in typ]}
    return schema_of[typ]


def _content(body: Bodies, schema_of: dict[object, dict[str, object]]) -> dict[str, object]:
    return {media: {"schema": _schema(typ, schema_of)} for media, typ in body.items()}


def _operation(op: Op, schema_of: dict[object, dict[str, object]]) -> dict[str, object]:
    responses: dict[str, object] = {
        str(op.status): {
            "description": REASONS[op.status],
            "content": _content(op.reply, schema_of),
        }
    }
    for status, body in op.extra.items():
        entry: dict[str, object] = {"description": REASONS[status]}
        if body:
            entry["content"] = _content(body, schema_of)
        responses[str(status)] = entry
    for status in op.errors:
        responses[str(status)] = {
            "description": REASONS[status],
            "content": {m: {"schema": _error_schema(status, schema_of)} for m in _ERROR_MEDIA},
        }
    out: dict[str, object] = {
        "operationId": op.op_id,
        "summary": op.summary,
        "tags": [op.tag],
        "responses": responses,
    }
    if op.path.startswith("/v1/") or op.path in KEYED:
        out["security"] = [{}, {"bearer": []}]  # keys are optional: the server may be open
    if op.params:
        out["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.required,
                "description": p.description,
                "schema": p.schema,
            }
            for p in op.params
        ]
    if op.request is not None:
        out["requestBody"] = {"required": True, "content": _content(op.request, schema_of)}
    return out


def _error_schema(status: int, schema_of: dict[object, dict[str, object]]) -> dict[str, object]:
    """The error body, with the codes that map to ``status`` (gateway.errors.STATUS)."""
    codes = sorted(code for code, s in STATUS.items() if s == status)
    if status == 500 or not codes:  # unknown codes map to 500 as well
        return schema_of[ErrorBody]
    code = {"properties": {"code": {"enum": codes}}}
    return {"allOf": [schema_of[ErrorBody], {"properties": {"error": code}}]}


CACHE = Cache()  # the gateway's: documents depend only on the routes, not the instance
