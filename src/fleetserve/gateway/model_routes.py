"""``POST /v1/models`` and ``DELETE /v1/models/{id}``: add a model to a running server,
or remove one, without a restart (the admin scope).

- ``POST /v1/models``: a JSON or msgpack body holding a spec mapping (the YAML fields
  ``ModelSpec.from_dict`` reads: ``id``, ``sources``, ``family``...). Checked here
  strictly, before anything is read: an unknown key, a malformed ``id`` or a source
  an API caller may not name (``model_checks``) is a 400 naming it, an ``id`` already
  served a 409. Then :class:`ModelAdmin` serves it; 201 with the model as
  ``GET /v1/models`` lists it. A body without ``family`` (``{"source": DIR}``) has its
  spec inferred from the model's files (:func:`infer_fields`).
- ``DELETE /v1/models/{id}``: the model's queued requests get a 404 naming it, those
  under way finish, then it is unloaded and forgotten; 200. 404 for an unknown id.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

from ..catalog import Catalog, ModelSpec
from ..catalog.infer import infer
from ..catalog.names import id_for_source
from ..catalog.spec import SPEC_FIELDS
from ..catalog.weights import resolve_sources
from ..settings import Settings
from ..wire import Conflict, FleetError, InvalidInput, ModelNotFound, Principal
from ..wire import Scope as KeyScope
from ..wire.codec import accept_of, encoding_of, loads
from .auth import require
from .errors import body_response, error_response
from .http import Receive, Scope, Send, header, read_body, respond
from .model_checks import check_model_id, check_sources

PREFIX = "/v1/models"
_KEY = re.compile(r"key '([a-z_]+)'")

# where a source's weights are on this machine (fetched once if need be)
Locate = Callable[[str, tuple[str, ...]], Path]


class ModelAdmin(Protocol):
    """What serves the models where the gateway runs: the embedded server's models
    (``hot_models.HotModels``), or in distributed mode what publishes the change."""

    async def add(self, spec: ModelSpec, fields: Mapping[str, object]) -> dict[str, Any]:
        """Serve ``spec`` (its id is new; its sources were checked) and return its entry
        of ``GET /v1/models``. ``fields``: the spec as a mapping (what a catalog file
        holds)."""
        ...

    async def remove(self, model: str) -> None:
        """Drain ``model``'s requests, unload it and forget it (``ModelNotFound`` if it
        is not served)."""
        ...


def handles(method: str, path: str) -> bool:
    """Whether ``method path`` is one of these routes (the keep-alive DELETE is not)."""
    if method == "POST":
        return path == PREFIX
    return method == "DELETE" and path.startswith(PREFIX + "/")


class ModelRoutes:
    """The two routes over ``admin``; call it after authenticating."""

    def __init__(
        self,
        admin: ModelAdmin,
        catalog: Catalog,
        roots: Sequence[str],
        locate: Locate,
        *,
        max_body_bytes: int,
    ) -> None:
        self.admin = admin
        self.catalog = catalog
        self.roots = list(roots)  # --model-roots: what POST may name as sources
        self.locate = locate
        self.max_body_bytes = max_body_bytes

    @classmethod
    def of(cls, admin: ModelAdmin, catalog: Catalog, settings: Settings) -> ModelRoutes:
        """The routes as ``settings`` configure them (the roots, the body limit)."""
        return cls(
            admin,
            catalog,
            settings.model_root_list(),
            lambda model, sources: resolve_sources(model, sources, settings),
            max_body_bytes=settings.max_body_bytes,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send, p: Principal) -> None:
        method: str = scope["method"]
        content_type = encoding_of(header(scope, b"content-type"))
        accept = accept_of(header(scope, b"accept"), content_type)
        try:
            require(p, KeyScope.ADMIN)
            if method == "POST":
                raw = await read_body(scope, receive, self.max_body_bytes)
                status, body = 201, await self.add(loads(raw, content_type))
            else:
                model = unquote(scope["path"][len(PREFIX) + 1 :])
                await self.remove(model)
                status, body = 200, {"id": model, "object": "model", "deleted": True}
        except FleetError as err:
            await respond(send, *error_response(err, accept))
            return
        await respond(send, *body_response(status, body, accept))

    async def add(self, body: object) -> dict[str, Any]:
        """Check ``body`` (see the module), infer what it leaves out, serve it."""
        fields = _mapping(body)
        sources = _source_list(fields)
        infer = "family" not in fields and bool(sources)  # a source alone: inferred
        if infer and "id" not in fields and sources:
            fields["id"] = id_for_source(sources[0])
        model = check_model_id(fields.get("id"))
        if model in self.catalog:
            raise Conflict(f"model {model!r} is served already; remove it first", field="id")
        check_sources(sources, self.roots)
        if infer:
            try:
                path = await asyncio.to_thread(self.locate, model, tuple(sources))
            except ModelNotFound as err:  # the source is the caller's input: a 400
                raise InvalidInput(err.message, field="sources") from None
            fields = {**await asyncio.to_thread(infer_fields, path), **fields}
        try:
            spec = ModelSpec.from_dict(fields)
        except ValueError as exc:
            named = _KEY.search(str(exc))
            raise InvalidInput(str(exc), field=named.group(1) if named else "spec") from None
        return await self.admin.add(spec, fields)

    async def remove(self, model: str) -> None:
        if model not in self.catalog:
            raise ModelNotFound(f"model {model!r} is not served here; nothing removed", field="id")
        await self.admin.remove(model)


def infer_fields(path: Path) -> dict[str, object]:
    """The spec's fields (without ``id`` and ``sources``) from the model's own files at
    ``path`` (``catalog.infer``): files that do not decide the family, a checkpoint
    that needs its own code or a corrupt file are a 400 naming it."""
    return infer(path).spec_fields()


def _mapping(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise InvalidInput(
            f"the body must be a model spec: a mapping of {', '.join(SPEC_FIELDS)}", field="body"
        )
    for key in body:
        if key not in SPEC_FIELDS:
            raise InvalidInput(
                f"unknown key {str(key)!r} in the model spec; allowed: {', '.join(SPEC_FIELDS)}",
                field=str(key),
            )
    return {str(k): v for k, v in body.items()}


def _source_list(fields: Mapping[str, object]) -> list[str]:
    """The sources as given (their form is checked by ``ModelSpec.from_dict``)."""
    got = fields.get("sources", fields.get("source"))
    items = [got] if isinstance(got, str) else got if isinstance(got, list) else []
    return [s for s in items if isinstance(s, str)]
