"""``/v1/adapters``: upload, list, show and delete LoRA adapters.

- ``POST /v1/adapters``: ``multipart/form-data`` (fields ``name``, optional ``base``,
  ``version``, ``pinned``; the files ``adapter_config.json`` and
  ``adapter_model.safetensors``, by file name or as fields ``config`` and
  ``weights``), or a msgpack/JSON body ``{name, base?, version?, pinned?, config,
  weights}`` (``config``: bytes, a string or an object; ``weights``: msgpack bin, or
  base64 in JSON). 201 with the adapter (its ``id`` with the version, ``sha256``...).
- ``GET /v1/adapters[?base=M]``: the adapters the caller sees.
- ``GET /v1/adapters/{id}`` and ``DELETE /v1/adapters/{id}``: ``tenant/name`` (newest;
  DELETE: every version), ``tenant/name@3``, or a bare ``name`` of the caller's tenant.

The gateway authenticates and passes the :class:`~fleetserve.wire.Principal`; writes
need ``adapters:write``, reads ``infer``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any
from urllib.parse import parse_qs, unquote

from ..lora.registry import AdapterRegistry
from ..lora.validate import CONFIG
from ..wire import Encoding, FleetError, Forbidden, InvalidInput, NotFound, Principal, Scope
from ..wire.codec import accept_of, encoding_of, loads
from . import multipart
from .errors import body_response, error_response
from .http import Receive, Send, header, read_body, respond
from .http import Scope as AsgiScope

PREFIX = "/v1/adapters"
MULTIPART = multipart.MULTIPART
FORM_FIELDS = ("name", "base", "version", "pinned")
BODY_FIELDS = (*FORM_FIELDS, "config", "weights")
_SLACK = 1 << 20  # room for the config and the multipart framing


class AdapterRoutes:
    """The ``/v1/adapters`` routes over ``registry``; call it after authenticating."""

    def __init__(self, registry: AdapterRegistry, *, max_body_bytes: int = 0) -> None:
        self.registry = registry
        self.max_body_bytes = max(max_body_bytes, registry.limits.max_bytes + _SLACK)

    @staticmethod
    def handles(path: str) -> bool:
        return path == PREFIX or path.startswith(PREFIX + "/")

    async def __call__(
        self, scope: AsgiScope, receive: Receive, send: Send, principal: Principal
    ) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        accept = accept_of(header(scope, b"accept"), Encoding.JSON)
        try:
            content_type = header(scope, b"content-type") or ""
            if not content_type.lower().startswith(MULTIPART):
                accept = accept_of(header(scope, b"accept"), encoding_of(content_type))
            rest = unquote(path[len(PREFIX) :].lstrip("/"))
            if not rest and method == "POST":
                status, body = 201, await self._create(scope, receive, principal, content_type)
            elif not rest and method == "GET":
                body = await self._list(scope, principal)
                status = 200
            elif rest and method == "GET":
                status, body = 200, (await self.registry.get(principal, rest)).to_dict()
            elif rest and method == "DELETE":
                if not principal.can(Scope.ADAPTERS_WRITE):
                    raise Forbidden("deleting adapters needs adapters:write", field="scope")
                gone = await self.registry.delete(principal, rest)
                body = {"object": "adapter.deleted", "deleted": [str(g) for g in gone]}
                status = 200
            else:
                raise NotFound(f"no route for {method} {path}", field="path")
        except FleetError as err:
            await respond(send, *error_response(err, accept))
            return
        await respond(send, *body_response(status, body, accept))

    async def _list(self, scope: AsgiScope, principal: Principal) -> dict[str, Any]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        base = query.get("base", [None])[-1] or None
        infos = await self.registry.list(principal, base=base)
        return {"object": "list", "data": [i.to_dict() for i in infos]}

    async def _create(
        self, scope: AsgiScope, receive: Receive, principal: Principal, content_type: str
    ) -> dict[str, Any]:
        if not principal.can(Scope.ADAPTERS_WRITE):
            raise Forbidden("uploading adapters needs the adapters:write scope", field="scope")
        raw = await read_body(scope, receive, self.max_body_bytes)
        if content_type.lower().startswith(MULTIPART):
            fields, config, weights, names = parse_multipart(raw, content_type)
        else:
            fields, config, weights = parse_body(loads(raw, encoding_of(content_type)))
            names = []
        info = await self.registry.create(
            principal,
            _text(fields, "name", required=True) or "",
            config,
            weights,
            names,
            base=_text(fields, "base"),
            version=_version(fields.get("version")),
            pinned=_flag(fields.get("pinned")),
        )
        return info.to_dict()


def parse_multipart(
    raw: bytes, content_type: str
) -> tuple[dict[str, Any], bytes, bytes, list[str]]:
    """(form fields, config bytes, weights bytes, uploaded file names)."""
    fields: dict[str, Any] = {}
    config = weights = None
    names: list[str] = []
    for name, filename, data in multipart.parse(raw, content_type):
        if filename is not None or name in ("config", "weights"):
            fname = filename or ""
            names.extend([fname] if fname else [])
            if name == "config" or fname.rsplit("/", 1)[-1] == CONFIG:
                config = data
            else:
                weights = data
        elif name in FORM_FIELDS:
            fields[name] = data.decode("utf-8", "replace")
        else:
            raise InvalidInput(
                f"unknown form field {name!r}; accepted: {', '.join(BODY_FIELDS)}", field=name
            )
    if config is None:
        raise InvalidInput(f"the upload has no {CONFIG}", field="config")
    if weights is None:
        raise InvalidInput("the upload has no adapter_model.safetensors", field="weights")
    return fields, config, weights, names


def parse_body(body: Any) -> tuple[dict[str, Any], bytes, bytes]:
    """(fields, config bytes, weights bytes) of a msgpack or JSON upload."""
    if not isinstance(body, dict):
        raise InvalidInput("the upload body must be an object", field="body")
    unknown = sorted(str(k) for k in body if k not in BODY_FIELDS)
    if unknown:
        raise InvalidInput(
            f"unknown field {unknown[0]!r}; accepted: {', '.join(BODY_FIELDS)}", field=unknown[0]
        )
    config = body.get("config")
    if isinstance(config, dict):
        config = json.dumps(config).encode()
    elif isinstance(config, str):
        config = config.encode()
    if not isinstance(config, bytes):
        raise InvalidInput(f"field config ({CONFIG}) is missing or not bytes", field="config")
    weights = body.get("weights")
    if isinstance(weights, str):
        try:
            weights = base64.b64decode(weights, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput("field weights is not base64", field="weights") from None
    if not isinstance(weights, bytes):
        raise InvalidInput("field weights (the safetensors bytes) is missing", field="weights")
    return {k: body[k] for k in FORM_FIELDS if k in body}, config, weights


def _text(fields: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    v = fields.get(key)
    if v is None or v == "":
        if required:
            raise InvalidInput(f"field {key} is required", field=key)
        return None
    if not isinstance(v, str):
        raise InvalidInput(f"field {key} must be a string", field=key)
    return v


def _version(v: Any) -> int | None:
    if v is None or v == "":
        return None
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidInput(f"field version must be a positive integer, not {v!r}", field="version")
    return v


def _flag(v: Any) -> bool:
    if v is None or isinstance(v, bool):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "1", "yes", "false", "0", "no", ""):
        return v.lower() in ("true", "1", "yes")
    raise InvalidInput(f"field pinned must be true or false, not {v!r}", field="pinned")
