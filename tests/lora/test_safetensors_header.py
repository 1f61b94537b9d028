"""Safetensors headers from bytes, without torch or pickle: each malformed file is a 400
naming what is wrong."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save

from fleetserve.lora.safetensors_header import check_filename, parse_header, read_header
from fleetserve.wire import InvalidInput


def build(header: dict[str, Any], data: bytes, *, pad_to: int = 0) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * max(0, pad_to - len(raw))
    return struct.pack("<Q", len(raw)) + raw + data


def tensor(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def bad(data: bytes, *words: str) -> str:
    with pytest.raises(InvalidInput) as info:
        parse_header(data)
    for w in words:
        assert w in info.value.message, (w, info.value.message)
    assert info.value.field == "weights"
    return info.value.message


def test_a_file_saved_by_safetensors_parses() -> None:
    arrays = {
        "a": np.zeros((4, 8), np.float32),
        "b": np.ones((8, 4), np.float16),
        "c": np.zeros((3,), np.float32),
    }
    data = save(arrays, metadata={"format": "pt"})
    h = parse_header(data)
    assert h.metadata == {"format": "pt"}
    assert {n: (t.dtype, t.shape) for n, t in h.tensors.items()} == {
        "a": ("F32", (4, 8)),
        "b": ("F16", (8, 4)),
        "c": ("F32", (3,)),
    }
    assert h.data_start == 8 + struct.unpack("<Q", data[:8])[0]


def test_truncated_files_are_refused() -> None:
    data = save({"a": np.zeros((4, 8), np.float32)})
    assert "truncated" in bad(data[:-1], "truncated", "128")
    bad(data[:20], "truncated", "header declares")
    bad(data[:5], "truncated")
    bad(b"", "truncated")


def test_offsets_past_the_end_gaps_and_overlaps_are_refused() -> None:
    past = build({"a": tensor("F32", [2], 0, 8), "b": tensor("F32", [2], 8, 16)}, bytes(12))
    bad(past, "truncated", "16 bytes", "12")
    gap = build({"a": tensor("F32", [2], 0, 8), "b": tensor("F32", [2], 12, 20)}, bytes(20))
    bad(gap, "'b'", "gap")
    overlap = build({"a": tensor("F32", [2], 0, 8), "b": tensor("F32", [2], 4, 12)}, bytes(12))
    bad(overlap, "'b'", "overlaps")
    extra = build({"a": tensor("F32", [2], 0, 8)}, bytes(9))
    bad(extra, "1 bytes after the last tensor")
    wrong_size = build({"a": tensor("F32", [3], 0, 8)}, bytes(8))
    bad(wrong_size, "'a'", "F32 [3]", "8 bytes")


def test_dtypes_other_than_f32_f16_bf16_are_refused() -> None:
    data = save({"a": np.zeros((2, 2), np.int64)})
    bad(data, "'a'", "unsupported dtype 'I64'", "F32, F16, BF16")
    bad(build({"a": tensor("Q4", [2], 0, 1)}, bytes(1)), "unknown dtype 'Q4'")
    bf16 = build({"a": tensor("BF16", [2, 2], 0, 8)}, bytes(8))
    assert parse_header(bf16).tensors["a"].dtype == "BF16"


def test_pickles_and_torch_zips_are_never_opened() -> None:
    pickled = pickle.dumps({"a": [1.0, 2.0]}, protocol=4)
    assert pickled[:1] == b"\x80"
    bad(pickled, "pickle", "never opened")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickled)
    bad(buf.getvalue(), "zip", "torch .pt")


def test_a_header_length_starting_with_0x80_is_still_safetensors() -> None:
    # 0x0280 = 640 bytes of header: the file starts with 0x80 0x02, like a pickle
    data = build({"a": tensor("F32", [2], 0, 8)}, bytes(8), pad_to=0x0280)
    assert data[:2] == b"\x80\x02"
    assert set(parse_header(data).tensors) == {"a"}


def test_garbage_and_bad_entries_are_named() -> None:
    bad(struct.pack("<Q", 4) + b"nope", "not JSON")
    bad(struct.pack("<Q", 2) + b"[]", "not an object")
    bad(struct.pack("<Q", 1 << 40) + bytes(8), "header")
    bad(build({"a": {"dtype": "F32", "shape": [1]}}, b""), "'a'", "data_offsets")
    bad(build({"a": tensor("F32", [-1], 0, 0)}, b""), "'a'", "shape")
    bad(build({"__metadata__": {"x": 1}}, b""), "__metadata__")


@pytest.mark.parametrize(
    "name", ["adapter_model.bin", "weights.pt", "x/y/model.PTH", "ckpt.pkl", "a.ckpt"]
)
def test_pickled_file_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput) as info:
        check_filename(name)
    assert name.rsplit("/", 1)[-1] in info.value.message
    assert "safetensors" in info.value.message


def test_read_header_reads_only_the_header(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(save({"w": np.zeros((64, 32), np.float64)}))
    h = read_header(path)  # a base's shards may hold any dtype
    assert h.tensors["w"].shape == (64, 32)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(InvalidInput, match="truncated") as info:
        read_header(path)
    assert info.value.field == "base"
