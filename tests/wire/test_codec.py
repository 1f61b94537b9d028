"""Body codecs: media types, msgpack/JSON round trips, typed decoding and arrays."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from fleetserve.wire import Encoding, InvalidInput, UnsupportedMediaType
from fleetserve.wire.codec import (
    TypedDecoder,
    accept_of,
    array_from_wire,
    array_to_wire,
    dumps,
    encoding_of,
    loads,
)
from fleetserve.wire.requests import EncodeRequest

MP, JS = Encoding.MSGPACK, Encoding.JSON


@pytest.mark.parametrize(
    ("header", "want"),
    [
        ("application/msgpack", MP),
        ("application/x-msgpack", MP),
        ("application/vnd.msgpack", MP),
        ("Application/MsgPack; charset=binary", MP),
        ("application/json", JS),
        ("application/json; charset=utf-8", JS),
        ("text/json", JS),
        ("application/vnd.api+json", JS),
    ],
)
def test_encoding_of_known_types(header: str, want: Encoding) -> None:
    assert encoding_of(header) is want


def test_encoding_of_missing_header_uses_the_default() -> None:
    assert encoding_of(None) is JS
    assert encoding_of("") is JS
    assert encoding_of(None, default=MP) is MP


@pytest.mark.parametrize("header", ["text/plain", "application/xml", "multipart/form-data"])
def test_encoding_of_unsupported_is_415_naming_the_field(header: str) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        encoding_of(header)
    assert info.value.field == "content-type"
    assert header in info.value.message


@pytest.mark.parametrize(
    ("accept", "request_enc", "want"),
    [
        (None, MP, MP),
        ("", JS, JS),
        ("*/*", MP, MP),
        ("application/json", MP, JS),
        ("application/msgpack", JS, MP),
        ("text/html, application/msgpack;q=0.9", JS, MP),
        ("application/json, application/msgpack", MP, JS),
        ("text/html", MP, MP),
        ("text/html, */*", JS, JS),
    ],
)
def test_accept_of(accept: str | None, request_enc: Encoding, want: Encoding) -> None:
    assert accept_of(accept, request_enc) is want


OBJ: dict[str, Any] = {
    "inputs": ["héllo", "wörld"],
    "n": 3,
    "x": 1.5,
    "ok": True,
    "none": None,
    "nested": {"a": [1, [2, 3]]},
}


@pytest.mark.parametrize("enc", [MP, JS])
def test_dumps_loads_round_trip(enc: Encoding) -> None:
    data = dumps(OBJ, enc)
    assert isinstance(data, bytes)
    assert loads(data, enc) == OBJ


def test_dumps_uses_the_named_encoding() -> None:
    assert msgspec.msgpack.decode(dumps(OBJ, MP)) == OBJ
    assert msgspec.json.decode(dumps(OBJ, JS)) == OBJ
    assert dumps(OBJ, MP) != dumps(OBJ, JS)


def test_msgpack_keeps_bytes_as_bin() -> None:
    assert loads(dumps({"b": b"\x00\xff"}, MP), MP) == {"b": b"\x00\xff"}


@pytest.mark.parametrize(
    ("raw", "enc"),
    [(b"{not json", JS), (b"", JS), (b"\x00\x01", JS), (b"\xc1", MP), (b"", MP), (b"\x92\x01", MP)],
)
def test_loads_malformed_is_invalid_input_on_body(raw: bytes, enc: Encoding) -> None:
    with pytest.raises(InvalidInput) as info:
        loads(raw, enc)
    assert info.value.field == "body"
    assert "malformed" in info.value.message


DEC = TypedDecoder(EncodeRequest)


@pytest.mark.parametrize("enc", [MP, JS])
def test_typed_decoder_decodes_struct(enc: Encoding) -> None:
    req = DEC.decode(dumps({"inputs": ["a", "b"], "dimensions": 4}, enc), enc)
    assert isinstance(req, EncodeRequest)
    assert (
        req.inputs == ["a", "b"] and req.dimensions == 4 and req.normalize is None
    )  # the model spec decides


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": ["ok", 1]}, "inputs[1]"),
        ({"inputs": [1]}, "inputs[0]"),
        ({"inputs": "x", "normalize": "yes"}, "normalize"),
        ({"inputs": "x", "dimensions": "four"}, "dimensions"),
        ({"normalize": True}, "inputs"),
        ({"inputs": "x", "surprise": 1}, "surprise"),
        ([1, 2], "body"),
    ],
)
@pytest.mark.parametrize("enc", [MP, JS])
def test_typed_decoder_names_the_field(body: Any, field: str, enc: Encoding) -> None:
    with pytest.raises(InvalidInput) as info:
        DEC.decode(dumps(body, enc), enc)
    assert info.value.field == field
    assert info.value.message.startswith("invalid request")


@pytest.mark.parametrize(("raw", "enc"), [(b"{", JS), (b"\xc1", MP)])
def test_typed_decoder_malformed_body(raw: bytes, enc: Encoding) -> None:
    with pytest.raises(InvalidInput) as info:
        DEC.decode(raw, enc)
    assert info.value.field == "body"
    assert "malformed" in info.value.message


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_array_round_trip(dtype: str) -> None:
    a = (np.arange(12) - 5).astype(dtype).reshape(3, 4)
    wire = array_to_wire(a)
    assert wire["dtype"] == dtype
    assert wire["shape"] == [3, 4]
    assert wire["data"] == a.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    back = array_from_wire(wire)
    assert back.dtype == np.dtype(dtype) and back.shape == (3, 4)
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_array_round_trip_through_msgpack(dtype: str) -> None:
    a = np.linspace(-2, 2, 10).astype(dtype).reshape(2, 5)
    back = array_from_wire(loads(dumps({"e": array_to_wire(a)}, MP), MP)["e"])
    np.testing.assert_array_equal(back, a)
    assert back.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", [">f4", ">f2"])
def test_big_endian_input_travels_little_endian(dtype: str) -> None:
    a = np.array([[1.0, -2.5], [3.25, 1000.0]], dtype=dtype)
    wire = array_to_wire(a)
    little = np.dtype(dtype).newbyteorder("<")
    assert wire["dtype"] == little.name
    assert wire["data"] == a.astype(little).tobytes()
    np.testing.assert_array_equal(array_from_wire(wire), a)


def test_non_contiguous_and_empty_arrays() -> None:
    a = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    np.testing.assert_array_equal(array_from_wire(array_to_wire(a)), a)
    empty = np.zeros((0, 8), dtype=np.float16)
    back = array_from_wire(array_to_wire(empty))
    assert back.shape == (0, 8) and back.dtype == np.float16


def test_array_from_wire_accepts_nested_lists() -> None:
    back = array_from_wire([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert back.shape == (2, 3)
    np.testing.assert_array_equal(back, [[1, 2, 3], [4, 5, 6]])
    assert array_from_wire(loads(dumps([[0.5], [1.5]], JS), JS)).shape == (2, 1)
