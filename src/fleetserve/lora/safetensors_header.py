"""A safetensors file's header, read from bytes without torch and without pickle.

The format: 8 bytes of little-endian header length ``n``, ``n`` bytes of JSON (an
object of tensor name -> ``{"dtype", "shape", "data_offsets": [begin, end]}`` plus an
optional ``"__metadata__"`` of strings), then the tensors' bytes, packed: offsets are
relative to the end of the header, and together they must cover the data exactly, with
no gap, no overlap and nothing past the end. Anything else (a pickle, a zip of a torch
``.pt``, a file cut short) is an :class:`~fleetserve.wire.InvalidInput` naming what is
wrong; nothing here ever unpickles.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ..wire import InvalidInput

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}  # what the mixed-adapter layer runs
ALL_DTYPES = {  # every dtype safetensors defines, to tell "unsupported" from "garbage"
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offsets into the data section (after the header)
    end: int


@dataclass(frozen=True, slots=True)
class Header:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int  # 8 + the header's length: where the data section begins


def check_filename(name: str, field: str = "weights") -> None:
    """A pickled checkpoint's file name (``.bin``, ``.pt``...) is refused by name."""
    base = os.path.basename(name).lower()
    if base.endswith(PICKLE_SUFFIXES):
        raise InvalidInput(
            f"{os.path.basename(name)}: pickled weights (.bin, .pt) are not accepted, since "
            "loading a pickle runs code; save the adapter as safetensors "
            "(save_pretrained(..., safe_serialization=True) writes adapter_model.safetensors)",
            field=field,
        )


def _not_safetensors(data: bytes, what: str, field: str) -> None:
    """A pickle starts with ``0x80`` and its protocol, a torch zip with ``PK``; a header
    length can start with those bytes too, but then the JSON header's ``{`` follows."""
    if data[8:9] == b"{":
        return
    if data[:1] == b"\x80":
        raise InvalidInput(
            f"{what} is a pickle (torch .bin/.pt), not safetensors; loading a pickle runs "
            "code, so it is never opened: save the adapter as safetensors",
            field=field,
        )
    if data[:2] == b"PK":
        raise InvalidInput(
            f"{what} is a zip archive (a torch .pt checkpoint), not safetensors: save the "
            "adapter as safetensors",
            field=field,
        )


def parse_header(
    data: bytes | memoryview,
    *,
    what: str = "adapter_model.safetensors",
    field: str = "weights",
    size: int | None = None,
    dtypes: dict[str, int] = DTYPE_BYTES,
    max_header: int = MAX_HEADER,
) -> Header:
    """The header of the safetensors file ``data``, checked against the file's size.

    ``data`` may hold just the start of the file when ``size`` gives its full length
    (reading a base model's shards without reading their tensors)."""
    head = bytes(data[:8])
    total = len(data) if size is None else size
    _not_safetensors(bytes(data[:9]), what, field)
    if total < 8:
        raise InvalidInput(f"{what} is truncated: {total} bytes, not even a header", field=field)
    (n,) = struct.unpack("<Q", head)
    if n > max_header:
        raise InvalidInput(
            f"{what}: its header declares {n} bytes, over the limit of {max_header}"
            + (" (max_safetensors_header_bytes)" if max_header < MAX_HEADER else ""),
            field=field,
        )
    if 8 + n > total:
        raise InvalidInput(
            f"{what} is truncated: its header declares {n} bytes, the file has {total - 8} "
            "after the length",
            field=field,
        )
    if 8 + n > len(data):
        raise ValueError(f"{what}: pass at least {8 + n} bytes to read its header")
    try:
        raw = json.loads(bytes(data[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(
            f"{what} is not safetensors: its header is not JSON ({exc})", field=field
        ) from None
    except RecursionError:  # "[[[[..." within the size limit: a 400, not a crashed request
        raise InvalidInput(
            f"{what} is not safetensors: its header is nested too deeply", field=field
        ) from None
    if not isinstance(raw, dict):
        raise InvalidInput(f"{what} is not safetensors: its header is not an object", field=field)
    meta = raw.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise InvalidInput(f"{what}: __metadata__ must map names to strings", field=field)
    tensors = {str(k): _tensor(str(k), v, what, field, dtypes) for k, v in raw.items()}
    _check_layout(tensors, total - 8 - n, what, field)
    return Header(tensors, dict(meta), 8 + n)


def _tensor(name: str, v: object, what: str, field: str, dtypes: dict[str, int]) -> TensorInfo:
    if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
        raise InvalidInput(
            f"{what}: tensor {name!r} is not {{dtype, shape, data_offsets}}", field=field
        )
    dtype, shape, offsets = v["dtype"], v["shape"], v["data_offsets"]
    if dtype not in dtypes:
        kind = "unsupported" if dtype in ALL_DTYPES else "unknown"
        raise InvalidInput(
            f"{what}: tensor {name!r} has {kind} dtype {dtype!r}; accepted: " + ", ".join(dtypes),
            field=field,
        )
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise InvalidInput(f"{what}: tensor {name!r} has a bad shape {shape!r}", field=field)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_count, offsets)):
        raise InvalidInput(f"{what}: tensor {name!r} has bad data_offsets {offsets!r}", field=field)
    begin, end = offsets
    if end - begin != math.prod(shape) * dtypes[dtype]:
        raise InvalidInput(
            f"{what}: tensor {name!r} is {dtype} {shape} but spans {end - begin} bytes",
            field=field,
        )
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_layout(tensors: dict[str, TensorInfo], data_len: int, what: str, field: str) -> None:
    at = 0
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin != at:
            problem = "overlaps the tensor before it" if t.begin < at else "leaves a gap before it"
            raise InvalidInput(f"{what}: tensor {t.name!r} {problem}", field=field)
        at = t.end
    if at > data_len:
        raise InvalidInput(
            f"{what} is truncated: its tensors need {at} bytes of data, the file has {data_len}",
            field=field,
        )
    if at < data_len:
        raise InvalidInput(
            f"{what}: {data_len - at} bytes after the last tensor (not safetensors)", field=field
        )


def read_header(path: Path, *, dtypes: dict[str, int] = ALL_DTYPES) -> Header:
    """The header of the safetensors file at ``path``, reading only the header's bytes
    (a base model's shards: any dtype is allowed there)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        data = head + f.read(min(n, MAX_HEADER))
    return parse_header(data, what=path.name, field="base", size=size, dtypes=dtypes)


def read_file_header(
    path: Path, *, what: str, field: str, max_header: int, dtypes: dict[str, int] = DTYPE_BYTES
) -> Header:
    """The header of an uploaded safetensors file on disk, refused before its JSON is
    read when it declares more than ``max_header`` bytes; no tensor is read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(9)
        _not_safetensors(head, what, field)
        n = struct.unpack("<Q", head[:8])[0] if len(head) >= 8 else 0
        if n > max_header:  # parse_header says so, from the first bytes alone
            return parse_header(head, what=what, field=field, size=size, max_header=max_header)
        f.seek(0)
        data = f.read(8 + n)
    return parse_header(
        data, what=what, field=field, size=size, dtypes=dtypes, max_header=max_header
    )
