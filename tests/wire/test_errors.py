"""The closed error hierarchy: stable codes, one body shape, and wire/ as a leaf."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

import fleetserve.wire
from fleetserve.wire import ERROR_TYPES, Encoding, FleetError, InternalError, error_from_body
from fleetserve.wire import errors as errors_mod
from fleetserve.wire.codec import dumps, loads

WIRE_DIR = Path(fleetserve.wire.__file__).parent


@pytest.mark.parametrize("code", sorted(ERROR_TYPES))
@pytest.mark.parametrize("field", ["inputs[2]", None])
def test_every_error_round_trips(code: str, field: str | None) -> None:
    cls = ERROR_TYPES[code]
    err = cls(f"something about {code}", field=field)
    body = err.to_body()
    assert body == {"error": {"code": code, "message": f"something about {code}", "field": field}}
    back = error_from_body(body)
    assert type(back) is cls
    assert (back.code, back.message, back.field) == (code, err.message, field)
    assert back.retry_after is None


@pytest.mark.parametrize("enc", [Encoding.MSGPACK, Encoding.JSON])
@pytest.mark.parametrize("code", sorted(ERROR_TYPES))
def test_round_trip_through_the_wire_encodings(code: str, enc: Encoding) -> None:
    err = ERROR_TYPES[code]("über-message", field="model")
    back = error_from_body(loads(dumps(err.to_body(), enc), enc), retry_after=2.5)
    assert type(back) is ERROR_TYPES[code]
    assert (back.message, back.field, back.retry_after) == ("über-message", "model", 2.5)


def test_errors_are_exceptions_with_the_message() -> None:
    for cls in ERROR_TYPES.values():
        err = cls("boom", field="f")
        assert isinstance(err, FleetError) and isinstance(err, Exception)
        assert str(err) == "boom"
        assert cls.__name__ in repr(err) and "'f'" in repr(err)


@pytest.mark.parametrize(
    "body",
    [
        None,
        "oops",
        42,
        [],
        {},
        {"error": None},
        {"error": "string"},
        {"error": []},
        {"detail": "not ours"},
    ],
)
def test_malformed_bodies_are_internal_errors(body: Any) -> None:
    err = error_from_body(body)
    assert type(err) is InternalError
    assert "malformed error body" in err.message


def test_unknown_code_is_internal_error_keeping_the_message() -> None:
    err = error_from_body({"error": {"code": "teapot", "message": "short and stout"}})
    assert type(err) is InternalError
    assert err.message == "short and stout" and err.field is None


def test_huge_malformed_body_message_is_bounded() -> None:
    assert len(error_from_body("x" * 10_000).message) <= 300


def _all_error_classes() -> list[type[FleetError]]:
    return [
        obj
        for _, obj in inspect.getmembers(errors_mod, inspect.isclass)
        if issubclass(obj, FleetError) and obj is not FleetError
    ]


def test_codes_are_unique_and_every_error_class_is_registered() -> None:
    classes = _all_error_classes()
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes)), f"duplicate codes: {sorted(codes)}"
    assert set(classes) == set(ERROR_TYPES.values())
    assert all(ERROR_TYPES[cls.code] is cls for cls in classes)
    assert all(code.islower() and " " not in code for code in codes)


def test_wire_exports_every_error_class() -> None:
    for cls in _all_error_classes():
        assert getattr(fleetserve.wire, cls.__name__) is cls
        assert cls.__name__ in fleetserve.wire.__all__


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
        elif isinstance(node, ast.Import):
            out.extend((0, alias.name) for alias in node.names)
    return out


def test_wire_is_a_leaf() -> None:
    files = sorted(WIRE_DIR.rglob("*.py"))
    assert len(files) >= 4
    bad = []
    for f in files:
        depth = len(f.relative_to(WIRE_DIR).parts) - 1  # levels below wire/
        for level, module in _imports(f):
            if level > 1 + depth:
                bad.append(f"{f.name}: from {'.' * level}{module}")
            ours = module == "fleetserve" or module.startswith("fleetserve.")
            in_wire = module == "fleetserve.wire" or module.startswith("fleetserve.wire.")
            if level == 0 and ours and not in_wire:
                bad.append(f"{f.name}: import {module}")
    assert not bad, f"wire/ must import nothing else of fleetserve: {bad}"


def test_brief_keeps_an_errors_kind_and_first_line_without_hosts_or_paths() -> None:
    """Before there was no such helper: records carried an exception's whole text."""
    from fleetserve.wire.errors import brief

    assert brief(RuntimeError("ValueError: bad shape (3, 4)")) == "ValueError: bad shape (3, 4)"
    assert brief(KeyError("a")) == "KeyError: 'a'" and brief(RuntimeError()) == "RuntimeError"
    said = brief(OSError("to nats://u@10.1.2.3:4222 and [::1]:80 at /home/x/.cache/f.bin\nmore"))
    assert said == "OSError: to <url> and <host> at <path>", said
    assert len(brief(ValueError("x" * 1000))) <= len("ValueError: ") + 200
    assert brief(ValueError("shape a/b mismatch")) == "ValueError: shape a/b mismatch"
