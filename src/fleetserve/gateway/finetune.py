"""``/v1/files`` and ``/v1/fine_tuning/jobs``: OpenAI's fine-tuning API, over
:class:`~fleetserve.lora.jobs.manager.FineTuning`.

- ``POST /v1/files``: ``multipart/form-data`` with a ``file`` part and
  ``purpose=fine-tune`` (as OpenAI's clients send it), or the raw JSONL with
  ``Content-Type: application/jsonl`` (``application/x-ndjson``, ``text/plain``) and
  ``?filename=``. 200 with the file; 413 over ``max_file_bytes``; 400 naming the line
  of a text over ``train_max_chars``, unless ``truncate=true`` (a form field or in the
  query) asks to cut such texts to it.
- ``GET /v1/files``, ``GET /v1/files/{id}``: the caller's files (an admin key's:
  every tenant's files and jobs, as it sees every tenant's adapters).
- ``POST /v1/fine_tuning/jobs``: a JSON or msgpack job; 200 with it, queued.
- ``GET /v1/fine_tuning/jobs[?limit=&after=]``: newest first; ``after`` is the last
  job id of the previous page.
- ``GET /v1/fine_tuning/jobs/{id}``, ``GET .../{id}/events[?limit=&after=]`` (newest
  first), ``POST .../{id}/cancel``.

The gateway authenticates and passes the :class:`~fleetserve.wire.Principal`; writes
need ``adapters:write`` (checked before a body is read), reads ``infer``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote

from ..lora.jobs.manager import FineTuning
from ..wire import (
    Encoding,
    FleetError,
    Forbidden,
    InvalidInput,
    NotFound,
    Principal,
    Scope,
    UnsupportedMediaType,
)
from ..wire.codec import accept_of, encoding_of, loads
from ..wire.finetune import PURPOSE
from . import multipart
from .auth import require
from .errors import body_response, error_response
from .http import Receive, Send, body_chunks, header, read_body, respond
from .http import Scope as AsgiScope
from .upload import Spool, Uploads

FILES = "/v1/files"
JOBS = "/v1/fine_tuning/jobs"
RAW_TYPES = ("application/jsonl", "application/x-ndjson", "application/json-lines", "text/plain")
FORM_FIELDS = ("file", "purpose", "truncate")
JOB_BODY_BYTES = 1 << 20  # a job is a small object
_SLACK = 64 * 1024  # the multipart framing around the file
DEFAULT_LIMIT, MAX_LIMIT = 20, 100


class FineTuneRoutes:
    """The fine-tuning routes over ``manager``; call it after authenticating."""

    def __init__(
        self, manager: FineTuning, *, max_file_bytes: int, uploads: Uploads | None = None
    ) -> None:
        self.manager = manager
        self.max_file_bytes = max_file_bytes
        self.uploads = uploads or Uploads()

    @staticmethod
    def handles(path: str) -> bool:
        return path == FILES or path.startswith((FILES + "/", "/v1/fine_tuning/"))

    async def __call__(
        self, scope: AsgiScope, receive: Receive, send: Send, principal: Principal
    ) -> None:
        sent = header(scope, b"content-type") or ""
        default = Encoding.MSGPACK if "msgpack" in sent.lower() else Encoding.JSON
        accept = accept_of(header(scope, b"accept"), default)
        try:
            status, body = 200, await self._route(scope, receive, principal)
        except FleetError as err:
            await respond(send, *error_response(err, accept))
            return
        await respond(send, *body_response(status, body, accept))

    async def _route(self, scope: AsgiScope, receive: Receive, principal: Principal) -> object:
        path: str = scope["path"]
        method: str = scope["method"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if path == FILES or path.startswith(FILES + "/"):
            rest = _parts(path, FILES)
            if rest == [] and method == "POST":
                _can_write(principal)
                return (await self._upload(scope, receive, principal, query)).to_dict()
            require(principal, Scope.INFER)
            if rest == [] and method == "GET":
                files = reversed(await self.manager.files(principal))
                return {"object": "list", "data": [f.to_dict() for f in files], "has_more": False}
            if len(rest) == 1 and method == "GET":
                return (await self.manager.file(principal, rest[0])).to_dict()
        elif path == JOBS or path.startswith(JOBS + "/"):
            rest = _parts(path, JOBS)
            if rest == [] and method == "POST":
                _can_write(principal)
                job = await self.manager.create_job(principal, await _body(scope, receive))
                return job.to_dict()
            if len(rest) == 2 and rest[1] == "cancel" and method == "POST":
                _can_write(principal)
                return (await self.manager.cancel(principal, rest[0])).to_dict()
            require(principal, Scope.INFER)
            if rest == [] and method == "GET":
                return await self._jobs(principal, query)
            if len(rest) == 1 and method == "GET":
                return (await self.manager.job(principal, rest[0])).to_dict()
            if len(rest) == 2 and rest[1] == "events" and method == "GET":
                after, limit = _text(query, "after"), _limit(query)
                rows, more = await self.manager.events(principal, rest[0], after=after, limit=limit)
                return {"object": "list", "data": rows, "has_more": more}
        raise NotFound(f"no route for {method} {path}", field="path")

    async def _upload(
        self, scope: AsgiScope, receive: Receive, principal: Principal, query: dict[str, list[str]]
    ) -> Any:
        content_type = header(scope, b"content-type") or ""
        raw = content_type.split(";", 1)[0].strip().lower() in RAW_TYPES
        if not raw and not multipart.is_multipart(content_type):
            raise UnsupportedMediaType(
                f"unsupported content type {content_type or 'none'!r} for a file; send "
                f"multipart/form-data (a file part and purpose) or {', '.join(RAW_TYPES)}",
                field="content-type",
            )
        with self.uploads.slot(principal.tenant):
            spool = self.uploads.spool(
                self.max_file_bytes, what="the file", field="file", setting="max_file_bytes"
            )
            try:
                truncate = _text(query, "truncate")
                if raw:
                    async for chunk in body_chunks(scope, receive, self.max_file_bytes):
                        await spool.write(chunk)
                    filename, purpose = _text(query, "filename") or "", _text(query, "purpose")
                else:
                    limit = self.max_file_bytes + _SLACK
                    form = await _form(scope, receive, content_type, limit, spool)
                    filename, purpose, truncate = form[0], form[1], form[2] or truncate
                await spool.finish()
                _check_purpose(purpose)
                cut = _flag(truncate, "truncate")
                name = filename.rsplit("/", 1)[-1]
                # checked from the spool a line at a time, the rows kept written to a
                # file beside it and moved into the store: never the file in memory
                return await self.manager.create_file(principal, name, spool.path, truncate=cut)
            finally:
                spool.discard()

    async def _jobs(self, principal: Principal, query: dict[str, list[str]]) -> dict[str, object]:
        rows = [j.to_dict() for j in reversed(await self.manager.jobs(principal))]
        after, limit = _text(query, "after"), _limit(query)
        if after is not None:
            ids = [r["id"] for r in rows]
            if after not in ids:
                raise InvalidInput(f"after {after!r} is not one of your jobs", field="after")
            rows = rows[ids.index(after) + 1 :]
        return {"object": "list", "data": rows[:limit], "has_more": len(rows) > limit}


def _can_write(principal: Principal) -> None:
    if not principal.can(Scope.ADAPTERS_WRITE):
        raise Forbidden("fine-tuning needs a key with the adapters:write scope", field="scope")


def _parts(path: str, prefix: str) -> list[str]:
    return [unquote(p) for p in path[len(prefix) :].strip("/").split("/") if p]


def _check_purpose(purpose: str | None) -> None:
    if purpose is not None and purpose != PURPOSE:
        raise InvalidInput(
            f"purpose must be {PURPOSE!r} (the only one this server takes), not {purpose!r}",
            field="purpose",
        )


async def _form(
    scope: AsgiScope, receive: Receive, content_type: str, limit: int, spool: Spool
) -> tuple[str, str | None, str | None]:
    """(filename, purpose, truncate) of an upload as OpenAI's clients send it, its file
    part written to ``spool`` as it arrives."""
    parser = multipart.StreamParser(content_type)
    filename: str | None = None
    purpose: bytearray | None = None
    truncate: bytearray | None = None
    part = ""
    async for chunk in body_chunks(scope, receive, limit):
        for event in parser.feed(chunk):
            if isinstance(event, multipart.Start):
                part = event.name
                if part == "file":
                    if filename is not None:
                        raise InvalidInput("the upload has two file parts; send one", field="file")
                    filename = event.filename or ""
                elif part == "purpose":
                    purpose = bytearray()
                elif part == "truncate":
                    truncate = bytearray()
                else:
                    raise InvalidInput(
                        f"unknown form field {part!r}; accepted: {', '.join(FORM_FIELDS)}",
                        field=part,
                    )
            elif isinstance(event, bytes):
                if part == "file":
                    await spool.write(event)
                elif part == "truncate" and truncate is not None and len(truncate) < 16:
                    truncate += event
                elif part == "purpose" and purpose is not None:
                    if len(purpose) + len(event) > _SLACK:
                        raise InvalidInput("field purpose is too long", field="purpose")
                    purpose += event
                else:
                    raise InvalidInput(f"field {part} is too long", field=part)
    parser.close()
    if purpose is None:
        raise InvalidInput(f"field purpose ({PURPOSE!r}) is required", field="purpose")
    if filename is None:
        raise InvalidInput("the upload has no file part (the JSONL of pairs)", field="file")
    said = truncate.decode("utf-8", "replace").strip() if truncate is not None else None
    return filename, purpose.decode("utf-8", "replace").strip(), said


def _flag(value: str | None, name: str) -> bool:
    """A yes/no parameter: true/false (1/0, yes/no); absent is false."""
    if value is None:
        return False
    said = value.strip().lower()
    if said not in ("true", "false", "1", "0", "yes", "no"):
        raise InvalidInput(f"{name} must be true or false, not {value[:20]!r}", field=name)
    return said in ("true", "1", "yes")


async def _body(scope: AsgiScope, receive: Receive) -> object:
    encoding = encoding_of(header(scope, b"content-type"))
    return loads(await read_body(scope, receive, JOB_BODY_BYTES), encoding)


def _text(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


def _limit(query: dict[str, list[str]]) -> int:
    raw = _text(query, "limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidInput(
            f"limit must be an integer from 1 to {MAX_LIMIT}, not {raw!r}", field="limit"
        )
    return int(raw)
