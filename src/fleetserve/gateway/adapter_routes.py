"""``/v1/adapters``: upload, list, show and delete LoRA adapters.

- ``POST /v1/adapters``: ``multipart/form-data`` (fields ``name``, optional ``base``,
  ``version``, ``pinned``; the files ``adapter_config.json`` and
  ``adapter_model.safetensors``, by file name or as fields ``config`` and
  ``weights``), or a msgpack/JSON body ``{name, base?, version?, pinned?, config,
  weights}`` (``config``: bytes, a string or an object; ``weights``: msgpack bin, or
  base64 in JSON). 201 with the adapter (its ``id`` with the version, ``sha256``...).
  A multipart upload's weights are spooled to disk as they arrive (see
  :mod:`.upload`), validated from the file and moved into the store; a msgpack/JSON
  body is held whole, so it is limited to ``max_body_bytes``.
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
from urllib.parse import parse_qs, unquote

from ..lora.registry import AdapterRegistry
from ..lora.safetensors_header import check_filename
from ..lora.validate import CONFIG, WEIGHTS, WeightsFile
from ..wire import (
    Encoding,
    FleetError,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Principal,
    Scope,
)
from ..wire.codec import accept_of, encoding_of, loads
from . import multipart
from .errors import body_response, error_response
from .http import Receive, Send, body_chunks, header, read_body, respond
from .http import Scope as AsgiScope
from .upload import Spool, Uploads

PREFIX = "/v1/adapters"
MULTIPART = multipart.MULTIPART
FORM_FIELDS = ("name", "base", "version", "pinned")
BODY_FIELDS = (*FORM_FIELDS, "config", "weights")
_SLACK = 1 << 20  # room for the config and the multipart framing
_FIELD_BYTES = 64 * 1024  # a form field: a name, a version


class AdapterRoutes:
    """The ``/v1/adapters`` routes over ``registry``; call it after authenticating."""

    def __init__(
        self, registry: AdapterRegistry, *, max_body_bytes: int = 0, uploads: Uploads | None = None
    ) -> None:
        self.registry = registry
        self.uploads = uploads or Uploads()
        self.max_body_bytes = registry.limits.max_bytes + _SLACK  # multipart: spooled
        # msgpack/JSON bodies are decoded whole: within max_body_bytes
        self.max_inline_bytes = min(max_body_bytes or self.max_body_bytes, self.max_body_bytes)

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

    async def _list(self, scope: AsgiScope, principal: Principal) -> dict[str, object]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        base = query.get("base", [None])[-1] or None
        infos = await self.registry.list(principal, base=base)
        return {"object": "list", "data": [i.to_dict() for i in infos]}

    async def _create(
        self, scope: AsgiScope, receive: Receive, principal: Principal, content_type: str
    ) -> dict[str, object]:
        if not principal.can(Scope.ADAPTERS_WRITE):
            raise Forbidden("uploading adapters needs the adapters:write scope", field="scope")
        with self.uploads.slot(principal.tenant):
            form = _Form(self.uploads, self.registry.limits.max_bytes)
            weights: bytes | WeightsFile
            try:
                if content_type.lower().startswith(MULTIPART):
                    await form.receive(scope, receive, content_type, self.max_body_bytes)
                    fields, config, weights, names = form.result()
                else:
                    raw = await self._inline(scope, receive)
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
            finally:
                form.discard()
        return info.to_dict()

    async def _inline(self, scope: AsgiScope, receive: Receive) -> bytes:
        try:
            return await read_body(scope, receive, self.max_inline_bytes)
        except PayloadTooLarge as err:
            raise PayloadTooLarge(
                f"{err.message}: a msgpack or JSON upload is held whole, so it is limited to "
                f"max_body_bytes; send a larger adapter as multipart/form-data",
                field=err.field,
            ) from None


class _Form:
    """A multipart upload's parts as they arrive: the form fields and the config in
    memory (small), the weights spooled to disk, hashed on the way."""

    def __init__(self, uploads: Uploads, max_weights: int) -> None:
        self.uploads, self.max_weights = uploads, max_weights
        self.fields: dict[str, object] = {}
        self.config: bytes | None = None
        self.weights: Spool | None = None
        self.names: list[str] = []
        self._part = ""  # the part being received: "config", "weights" or a field's name
        self._buf = bytearray()

    async def receive(
        self, scope: AsgiScope, receive: Receive, content_type: str, limit: int
    ) -> None:
        parser = multipart.StreamParser(content_type)
        async for chunk in body_chunks(scope, receive, limit):
            for event in parser.feed(chunk):
                if isinstance(event, multipart.Start):
                    self._start(event)
                elif isinstance(event, bytes):
                    await self._data(event)
                else:
                    self._end()
        parser.close()
        if self.weights is not None:
            await self.weights.finish()

    def _start(self, part: multipart.Start) -> None:
        name, filename = part
        self._buf = bytearray()
        if filename is not None or name in ("config", "weights"):
            fname = filename or ""
            self.names.extend([fname] if fname else [])
            if name == "config" or fname.rsplit("/", 1)[-1] == CONFIG:
                self._part = "config"
                return
            check_filename(fname)  # a pickle is refused before its bytes are received
            if self.weights is not None:  # a later file replaces an earlier one
                self.weights.discard()
            self.weights = self.uploads.spool(
                self.max_weights, what=WEIGHTS, field="weights", setting="max_adapter_bytes"
            )
            self._part = "weights"
        elif name in FORM_FIELDS:
            self._part = name
        else:
            raise InvalidInput(
                f"unknown form field {name!r}; accepted: {', '.join(BODY_FIELDS)}", field=name
            )

    async def _data(self, data: bytes) -> None:
        if self._part == "weights":
            assert self.weights is not None
            await self.weights.write(data)
            return
        self._buf += data
        cap = _SLACK if self._part == "config" else _FIELD_BYTES
        if len(self._buf) > cap:
            what = CONFIG if self._part == "config" else f"form field {self._part}"
            raise PayloadTooLarge(f"{what} is over {cap} bytes", field=self._part)

    def _end(self) -> None:
        if self._part == "config":
            self.config = bytes(self._buf)
        elif self._part != "weights":
            self.fields[self._part] = self._buf.decode("utf-8", "replace")
        self._buf = bytearray()

    def result(self) -> tuple[dict[str, object], bytes, WeightsFile, list[str]]:
        """(form fields, config bytes, the spooled weights, uploaded file names)."""
        if self.config is None:
            raise InvalidInput(f"the upload has no {CONFIG}", field="config")
        if self.weights is None:
            raise InvalidInput("the upload has no adapter_model.safetensors", field="weights")
        w = self.weights
        return self.fields, self.config, WeightsFile(w.path, w.size, w.sha256), self.names

    def discard(self) -> None:
        if self.weights is not None:
            self.weights.discard()


def parse_body(body: object) -> tuple[dict[str, object], bytes, bytes]:
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


def _text(fields: dict[str, object], key: str, *, required: bool = False) -> str | None:
    v = fields.get(key)
    if v is None or v == "":
        if required:
            raise InvalidInput(f"field {key} is required", field=key)
        return None
    if not isinstance(v, str):
        raise InvalidInput(f"field {key} must be a string", field=key)
    return v


def _version(v: object) -> int | None:
    if v is None or v == "":
        return None
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidInput(f"field version must be a positive integer, not {v!r}", field="version")
    return v


def _flag(v: object) -> bool:
    if v is None or isinstance(v, bool):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "1", "yes", "false", "0", "no", ""):
        return v.lower() in ("true", "1", "yes")
    raise InvalidInput(f"field pinned must be true or false, not {v!r}", field="pinned")
