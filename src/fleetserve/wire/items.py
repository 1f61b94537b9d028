"""Prepared items and raw outputs as bytes, for the slices of a request workers share.

msgpack with one extension for numpy arrays (dtype, shape, little-endian bytes).
Tuples come back as lists. Anything else that is not plain data (a dataclass, a
custom object) raises ``TypeError`` at ``pack``: such a request is not sliced.
Nothing here unpickles: a message from the queue can only ever build plain data.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from .values import Array

_ARRAY = 1  # msgpack extension code


def _enc_hook(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.hasobject:
            raise TypeError("object arrays cannot travel")
        head = _ENC.encode([arr.dtype.str, list(arr.shape)])
        return msgspec.msgpack.Ext(_ARRAY, len(head).to_bytes(4, "little") + head + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} cannot travel as a slice")


def _ext_hook(code: int, data: memoryview) -> Array:
    if code != _ARRAY:
        raise ValueError(f"unknown extension {code}")
    n = int.from_bytes(data[:4], "little")
    dtype, shape = msgspec.msgpack.decode(data[4 : 4 + n])
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError("object arrays cannot travel")
    return np.frombuffer(data[4 + n :], dtype=dt).reshape(shape).copy()


_ENC = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DEC = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


def pack(obj: object) -> bytes:
    """``obj`` as bytes; ``TypeError`` if it holds something that is not plain data."""
    return _ENC.encode(obj)


def unpack(data: bytes) -> Any:
    """What ``pack`` wrote; ``ValueError`` if the bytes are not such a message."""
    try:
        return _DEC.decode(data)
    except (msgspec.DecodeError, TypeError) as exc:
        raise ValueError(f"not a slice message: {exc}") from None
