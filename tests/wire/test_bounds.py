"""Bounded scans of a body before it is decoded (wire/bounds.py) and the decoders'
answer to deep nesting (wire/codec.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from fleetserve.wire import Encoding, InvalidInput, bounds
from fleetserve.wire.codec import TypedDecoder, check_depth, loads
from fleetserve.wire.requests import EmbeddingsRequest


def _depth(obj: Any) -> int:
    if isinstance(obj, list | dict):
        values = obj.values() if isinstance(obj, dict) else obj
        return 1 + max((_depth(v) for v in values), default=0)
    return 0


def _value(rnd: random.Random, level: int) -> Any:
    r = rnd.random()
    if level > 10 or r < 0.3:  # strings full of brackets, quotes and backslashes
        return rnd.choice(['a\\"[{', "\\\\", 'x"]', "}]\\", 1, 2.5, None, True, "ü[", b"\x91"])
    if r < 0.65:
        return [_value(rnd, level + 1) for _ in range(rnd.randint(0, 4))]
    return {f"k[{i}\\": _value(rnd, level + 1) for i in range(rnd.randint(0, 4))}


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [16, 1 << 18])
def test_scans_agree_with_the_decoded_structure(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Depth and element counts, strings and escapes masked across chunk edges (new)."""
    monkeypatch.setattr(bounds, "_CHUNK", chunk)
    rnd = random.Random(chunk)
    for _ in range(40):
        obj = _value(rnd, 0)
        deep = _depth(obj)
        js = json.dumps(obj, default=lambda b: "bytes").encode()
        mp = msgspec.msgpack.encode(obj)
        for limit in range(deep + 2):
            assert bounds.json_too_deep(js, limit) == (deep > limit), (js, limit)
            assert bounds.msgpack_too_deep(mp, limit) == (deep > limit), (obj, limit)
        count = len(obj) if isinstance(obj, list) else None
        assert bounds.json_elements(js) == count, js
        assert bounds.msgpack_elements(mp) == count


DEEP_JSON = b"[" * 1000 + b"]" * 1000  # 2 KB
DEEP_MSGPACK = b"\x91" * 1000 + b"\x90"


@pytest.mark.parametrize(
    ("body", "encoding"), [(DEEP_JSON, Encoding.JSON), (DEEP_MSGPACK, Encoding.MSGPACK)]
)
def test_loads_answers_deep_nesting_with_a_400(body: bytes, encoding: Encoding) -> None:
    """Before, msgspec's RecursionError escaped loads (a 500 on every route using it)."""
    with pytest.raises(InvalidInput, match=r"nested more than 64 deep \(max_nesting_depth\)"):
        loads(body, encoding)
    with pytest.raises(InvalidInput, match="nested more than 8 deep"):
        loads(b"[" * 9 + b"]" * 9, Encoding.JSON, max_depth=8)
    assert loads(b"[" * 8 + b"]" * 8, Encoding.JSON, max_depth=8) == [[[[[[[[]]]]]]]]
    with pytest.raises(InvalidInput, match="nested too deeply"):  # no limit: the interpreter's
        loads(b"[" * 100_000 + b"]" * 100_000, Encoding.JSON, max_depth=0)


def test_typed_decoding_of_a_deep_body_is_a_400() -> None:
    """Before, a deep unknown field made TypedDecoder raise RecursionError (a 500)."""
    body = b'{"model": "m", "input": "x", "extra": ' + DEEP_JSON + b"}"
    with pytest.raises(InvalidInput, match="nested too deeply"):
        TypedDecoder(EmbeddingsRequest).decode(body, Encoding.JSON)
    with pytest.raises(InvalidInput, match="max_nesting_depth") as err:
        check_depth(body, Encoding.JSON, 64)
    assert err.value.field == "body"
    check_depth(body, Encoding.JSON, 0)  # 0: no check
