"""Output dtypes for vectors: float32, float16, scaled int8 and packed sign bits.

The reply formats (native ``/v1/encode``; msgpack arrays, or nested lists in JSON):

- ``float32`` / ``float16``: ``embeddings`` holds the values in that dtype.
- ``int8``: ``embeddings`` holds int8 codes and ``scales`` one float32 per vector, with
  ``q = rint(x / max|x| * 127)`` (round half to even) and ``scale = max|x| / 127``, so
  ``x ~= q * scale``. An all-zero vector has codes 0 and scale 0.
- ``binary``: ``embeddings`` holds uint8 bytes, the sign bits (1 where ``x > 0``)
  packed 8 per byte with ``numpy.packbits(bits, axis=-1, bitorder="big")``: bit 7 of
  byte 0 is dimension 0. ``dimensions`` is the number of real bits per vector (the last
  byte is zero-padded when it is not a multiple of 8).

Both quantized forms also carry ``"output_dtype"`` in the reply.
"""

from __future__ import annotations

import numpy as np

from ..wire import Encoding, InvalidInput, OutputDtype
from ..wire.codec import array_to_wire
from ..wire.values import Array

FLOAT_DTYPES = {"float32": np.float32, "float16": np.float16}
OUTPUT_DTYPES = tuple(d.value for d in OutputDtype)


def check_output_dtype(name: str, field: str = "output_dtype") -> str:
    if name not in OUTPUT_DTYPES:
        raise InvalidInput(f"{field} must be one of {', '.join(OUTPUT_DTYPES)}", field=field)
    return name


def quantize(rows: Array, dtype: str) -> tuple[Array, Array | None]:
    """``[n, d]`` float rows in ``dtype``: (values, int8 scales or ``None``)."""
    x = np.asarray(rows, dtype=np.float32)
    if dtype in FLOAT_DTYPES:
        return np.ascontiguousarray(x, dtype=FLOAT_DTYPES[dtype]), None
    if dtype == OutputDtype.INT8:
        peak = np.abs(x).max(axis=-1, keepdims=True) if x.shape[-1] else np.zeros((len(x), 1))
        safe = np.where(peak > 0, peak, 1.0)
        q = np.clip(np.rint(x / safe * 127.0), -127, 127).astype(np.int8)
        return q, (peak[:, 0] / 127.0).astype(np.float32)
    if dtype == OutputDtype.BINARY:
        return np.packbits(x > 0, axis=-1, bitorder="big"), None
    raise InvalidInput(
        f"output_dtype must be one of {', '.join(OUTPUT_DTYPES)}", field="output_dtype"
    )


def _wire(arr: Array, accept: Encoding) -> object:
    return array_to_wire(arr) if accept is Encoding.MSGPACK else arr.tolist()


def vectors_body(rows: Array, dtype: str, accept: Encoding) -> dict[str, object]:
    """The reply fields for one ``[n, d]`` matrix: ``embeddings`` (+ ``scales`` etc.)."""
    values, scales = quantize(rows, dtype)
    body: dict[str, object] = {"embeddings": _wire(values, accept)}
    _extras(body, dtype, rows.shape[-1], None if scales is None else _wire(scales, accept))
    return body


def ragged_body(mats: list[Array], dtype: str, dim: int, accept: Encoding) -> dict[str, object]:
    """The reply fields for a list of ``[n_i, d]`` matrices (one array per item)."""
    pairs = [quantize(m, dtype) for m in mats]
    body: dict[str, object] = {"embeddings": [_wire(v, accept) for v, _ in pairs]}
    scales = [_wire(s, accept) for _, s in pairs if s is not None]
    _extras(body, dtype, dim, scales if dtype == OutputDtype.INT8 else None)
    return body


def _extras(body: dict[str, object], dtype: str, dim: int, scales: object) -> None:
    if dtype == OutputDtype.INT8:
        body["scales"] = scales
        body["output_dtype"] = dtype
    elif dtype == OutputDtype.BINARY:
        body["dimensions"] = int(dim)
        body["output_dtype"] = dtype
