"""What the SDK returns besides plain arrays: quantized and sparse vectors, rerank results."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray


def unpack_bits(packed: npt.ArrayLike, dimensions: int | None = None) -> NDArray[np.uint8]:
    """Packed sign bits (``output_dtype="binary"``) back to one 0/1 uint8 per dimension.

    Bits are big-endian within each byte (``numpy.packbits(..., bitorder="big")``): bit 7
    of byte 0 is dimension 0. ``dimensions`` drops the zero padding of the last byte.
    """
    bits = np.unpackbits(np.asarray(packed, dtype=np.uint8), axis=-1, bitorder="big")
    return bits if dimensions is None else bits[..., :dimensions]


@dataclass(frozen=True)
class Quantized:
    """Vectors as the server quantized them (``output_dtype`` ``"int8"`` or ``"binary"``).

    - ``"int8"``: ``values`` is int8 ``[n, d]`` and ``scales`` float32 ``[n]``, with
      ``values = rint(x / max|x| * 127)`` per vector, so ``x ~= values * scales[:, None]``.
    - ``"binary"``: ``values`` is uint8 ``[n, ceil(d / 8)]``, the sign bits (1 where
      ``x > 0``) packed big-endian; ``dimensions`` is ``d``; ``scales`` is ``None``.
    """

    dtype: str
    values: NDArray[np.int8] | NDArray[np.uint8]
    scales: NDArray[np.float32] | None
    dimensions: int

    def dequantize(self) -> NDArray[np.float32]:
        """float32 ``[n, d]``: ``values * scales`` for int8, +1/-1 per bit for binary."""
        if self.dtype == "int8":
            assert self.scales is not None
            return self.values.astype(np.float32) * self.scales.astype(np.float32)[..., None]
        return self.unpack().astype(np.float32) * 2.0 - 1.0

    def unpack(self) -> NDArray[np.uint8]:
        """Binary only: the 0/1 bits, uint8 ``[n, d]``."""
        if self.dtype != "binary":
            raise ValueError("unpack() is for output_dtype='binary'; use dequantize() for int8")
        return unpack_bits(self.values, self.dimensions)

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class SparseVector:
    """One sparse (SPLADE) embedding: ascending vocabulary ids and their weights."""

    indices: NDArray[np.uint32]
    values: NDArray[np.float32]
    tokens: list[str] | None = None  # with return_tokens=True

    def to_dict(self) -> dict[int, float]:
        return {int(i): float(v) for i, v in zip(self.indices, self.values, strict=True)}

    def dense(self, size: int) -> NDArray[np.float32]:
        """The full ``[size]`` float32 vector (``size``: the vocabulary size)."""
        out = np.zeros(size, dtype=np.float32)
        out[self.indices.astype(np.int64)] = self.values
        return out


@dataclass(frozen=True)
class RerankResult:
    """One ``/v1/rerank`` result, best first: the document's index in the request."""

    index: int
    relevance_score: float
    document: str | None = None  # with return_documents=True
