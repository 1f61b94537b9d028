"""Body codecs: msgpack and JSON, typed request decoding and array encoding.

Arrays travel as ``{"dtype", "shape", "data"}`` with raw little-endian bytes in
msgpack, and as nested lists (or base64 where the OpenAI API allows) in JSON.
"""

from __future__ import annotations

import re
from typing import Any, Generic, TypeVar

import msgspec
import numpy as np

from .bounds import json_too_deep, msgpack_too_deep
from .errors import InvalidInput, UnsupportedMediaType
from .types import Encoding
from .values import Array

T_co = TypeVar("T_co", covariant=True)  # what a TypedDecoder decodes to

_msgpack_enc = msgspec.msgpack.Encoder()
_json_enc = msgspec.json.Encoder()
_msgpack_any = msgspec.msgpack.Decoder()
_json_any = msgspec.json.Decoder()
_PATH = re.compile(r"at `\$\.?([^`]*)`")
MAX_DEPTH = 64  # the max_nesting_depth setting's default


def encoding_of(content_type: str | None, *, default: Encoding = Encoding.JSON) -> Encoding:
    """Map a Content-Type or Accept header to an :class:`Encoding` (or fail with 415)."""
    if not content_type:
        return default
    ct = content_type.split(";", 1)[0].strip().lower()
    if ct in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
        return Encoding.MSGPACK
    if ct in ("application/json", "text/json") or ct.endswith("+json"):
        return Encoding.JSON
    raise UnsupportedMediaType(
        f"unsupported content type {content_type!r}; use application/msgpack or application/json",
        field="content-type",
    )


def accept_of(accept: str | None, content_type: Encoding) -> Encoding:
    """The reply encoding: the Accept header if it names one we speak, else the request's."""
    if not accept:
        return content_type
    for part in accept.split(","):
        ct = part.split(";", 1)[0].strip().lower()
        if ct in ("*/*", ""):
            return content_type
        try:
            return encoding_of(ct)
        except UnsupportedMediaType:
            continue
    return content_type


def dumps(obj: object, encoding: Encoding) -> bytes:
    enc = _msgpack_enc if encoding is Encoding.MSGPACK else _json_enc
    return enc.encode(obj)


def check_depth(data: bytes, encoding: Encoding, max_depth: int = MAX_DEPTH) -> None:
    """400 when ``data`` nests arrays and objects deeper than ``max_depth``; a bounded
    scan that decodes nothing (:mod:`.bounds`). ``max_depth`` 0: no check."""
    if max_depth <= 0:
        return
    deep = msgpack_too_deep if encoding is Encoding.MSGPACK else json_too_deep
    if deep(data, max_depth):
        raise too_deep(encoding, max_depth)


def too_deep(encoding: Encoding, max_depth: int | None) -> InvalidInput:
    limit = f"more than {max_depth} deep (max_nesting_depth)" if max_depth else "too deeply"
    return InvalidInput(
        f"malformed {encoding.name.lower()} body: arrays and objects nested {limit}",
        field="body",
    )


def loads(data: bytes, encoding: Encoding, *, max_depth: int = MAX_DEPTH) -> Any:
    """Decode a whole body to plain values; 400 for one malformed or nested deeper than
    ``max_depth`` (checked before decoding). Every body the gateway decodes goes here or
    through :class:`TypedDecoder`."""
    check_depth(data, encoding, max_depth)
    try:
        dec = _msgpack_any if encoding is Encoding.MSGPACK else _json_any
        return dec.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"malformed {encoding.name.lower()} body: {exc}", field="body") from None
    except RecursionError:  # deeper than the interpreter allows (max_depth 0)
        raise too_deep(encoding, None) from None


class TypedDecoder(Generic[T_co]):
    """Decode a body straight into a typed struct, with errors that name the field; a
    body nested past the interpreter's recursion limit is a 400 too (callers that take
    bodies from clients run :func:`check_depth` first for the configured limit)."""

    def __init__(self, typ: type[T_co]) -> None:
        self._typ = typ
        self._mp = msgspec.msgpack.Decoder(typ)
        self._js = msgspec.json.Decoder(typ)

    def decode(self, data: bytes, encoding: Encoding) -> T_co:
        dec = self._mp if encoding is Encoding.MSGPACK else self._js
        try:
            return dec.decode(data)
        except msgspec.ValidationError as exc:
            msg = str(exc)
            m = _PATH.search(msg)
            field = m.group(1) if m and m.group(1) else None
            if field is None and "unknown field" in msg:
                um = re.search(r"unknown field `([^`]+)`", msg)
                field = um.group(1) if um else None
            if field is None and "missing required field" in msg:
                fm = re.search(r"`([^`]+)`", msg)
                field = fm.group(1) if fm else None
            raise InvalidInput(f"invalid request: {msg}", field=field or "body") from None
        except msgspec.DecodeError as exc:
            kind = encoding.name.lower()
            raise InvalidInput(f"malformed {kind} body: {exc}", field="body") from None
        except RecursionError:
            raise too_deep(encoding, None) from None


def array_to_wire(arr: Array) -> dict[str, object]:
    """The msgpack array form: dtype, shape and raw little-endian bytes."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": a.tobytes()}


def array_from_wire(obj: object) -> Array:
    """Inverse of :func:`array_to_wire`; also accepts nested lists (the JSON form)."""
    if isinstance(obj, dict) and {"dtype", "shape", "data"} <= obj.keys():
        dt = np.dtype(str(obj["dtype"])).newbyteorder("<")
        return np.frombuffer(obj["data"], dtype=dt).reshape(obj["shape"])
    return np.asarray(obj)
