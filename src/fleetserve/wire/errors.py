"""The one closed error hierarchy.

Every failure that crosses a boundary (worker to gateway, server to client) is a
:class:`FleetError`. Each carries a stable ``code`` and structured fields. The HTTP
status for each code is decided in exactly one place, ``gateway.errors``; the SDK
rebuilds the same classes from the error body, so clients catch the same types.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar


class FleetError(Exception):
    """Base of all fleetserve errors. ``code`` is stable and goes on the wire."""

    code: ClassVar[str] = "internal_error"

    def __init__(
        self, message: str, *, field: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after = retry_after

    def fresh(self, *, retry_after: float | None = None) -> FleetError:
        """A new error of this kind and message, without this one's traceback (raising
        one stored error again and again would grow its traceback each time)."""
        again = type(self)(self.message, field=self.field, retry_after=self.retry_after)
        if retry_after is not None:
            again.retry_after = retry_after
        return again

    def to_body(self) -> dict[str, object]:
        """The error body shape used everywhere: ``{"error": {code, message, field}}``."""
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, field={self.field!r})"


class InvalidInput(FleetError):
    """The request is malformed, has wrong types, or violates a limit."""

    code = "invalid_input"


class Unauthorized(FleetError):
    """The API key is missing or wrong."""

    code = "unauthorized"


class Forbidden(FleetError):
    """The API key is valid but lacks the scope this call needs."""

    code = "forbidden"


class Conflict(FleetError):
    """The resource exists already, or another request is creating it."""

    code = "conflict"


class AdapterNotFound(FleetError):
    """No adapter of that id is visible to the caller (another tenant's reads as none)."""

    code = "adapter_not_found"


class ModelNotFound(FleetError):
    """No model of that name is in the catalog."""

    code = "model_not_found"


class PayloadTooLarge(FleetError):
    """The request body is larger than the configured limit."""

    code = "payload_too_large"


class UnsupportedMediaType(FleetError):
    """The Content-Type is neither msgpack nor JSON."""

    code = "unsupported_media_type"


class NotFound(FleetError):
    """No such route."""

    code = "not_found"


class Overloaded(FleetError):
    """The bounded queue is full; retry after ``retry_after`` seconds."""

    code = "overloaded"


class Unavailable(FleetError):
    """The server cannot serve right now (not ready, worker failed); retryable."""

    code = "unavailable"


class DeadlineExceeded(FleetError):
    """The request's deadline passed before a result was ready."""

    code = "deadline_exceeded"


class InternalError(FleetError):
    """An unexpected failure. The message never carries a traceback."""

    code = "internal_error"


class Cancelled(FleetError):
    """The client went away (or its deadline passed) and its work was stopped. Counted
    in metrics and logs as 499, after nginx; no client is there to receive it."""

    code = "cancelled"


ERROR_TYPES: dict[str, type[FleetError]] = {
    cls.code: cls
    for cls in (
        InvalidInput,
        Unauthorized,
        Forbidden,
        Conflict,
        AdapterNotFound,
        ModelNotFound,
        PayloadTooLarge,
        UnsupportedMediaType,
        NotFound,
        Overloaded,
        Unavailable,
        DeadlineExceeded,
        InternalError,
        Cancelled,
    )
}


def error_from_body(body: Any, *, retry_after: float | None = None) -> FleetError:
    """Rebuild the typed error from an error body (used by the gateway and the SDK)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return InternalError(f"malformed error body: {body!r}"[:300])
    cls = ERROR_TYPES.get(str(err.get("code")), InternalError)
    field = err.get("field")
    return cls(
        str(err.get("message", "")),
        field=str(field) if field is not None else None,
        retry_after=retry_after,
    )


# what a message a caller reads (a job record, say) must not carry: URLs, hosts, paths
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
_HOST = re.compile(
    r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?"  # an IPv4 address, maybe with a port
    r"|\[[0-9a-f:]+\](?::\d+)?"  # an IPv6 one
    r"|\b[\w-]+(?:\.[\w-]+)+:\d{2,5}\b",  # a host name with a port
    re.I,
)
_PATH = re.compile(r"(?<![\w/])/(?:[^\s/'\"]+/)+[^\s'\",)]*")
_TYPED = re.compile(r"[A-Z][\w.]*: ")  # "ValueError: ..." as the child reports it
_BRIEF = 200  # characters of an error's first line kept


def brief(exc: BaseException) -> str:
    """A failure as a caller may read it (a fine-tuning job's record): the exception's
    type and the first line of its text, cut to 200 characters, with URLs, hosts and
    absolute paths left out (the log has them all)."""
    text = next(iter(str(exc).strip().splitlines()), "")
    text = _PATH.sub("<path>", _HOST.sub("<host>", _URL.sub("<url>", text)))[:_BRIEF]
    name = type(exc).__name__
    if type(exc) is RuntimeError and _TYPED.match(text):  # the child's, typed already
        return text
    return f"{name}: {text}" if text else name
