"""The knee bench's parts: target parsing, request pools, the report's files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fleetserve.bench.knee_find import KneePoint, find_knee
from fleetserve.bench.knee_http import TargetError, parse_targets, requests_of
from fleetserve.bench.knee_report import TargetResult, fmt, markdown, write

URL = "http://127.0.0.1:7997/embeddings"


def test_targets_are_named_and_carry_their_model() -> None:
    a, b = parse_targets([f"inf={URL}", "http://10.0.0.2:8080/v1/embeddings"], ["inf=/m"], "M")
    assert (a.name, a.url, a.model) == ("inf", URL, "/m")
    assert (b.name, b.model) == ("10.0.0.2:8080", "M")
    (c,) = parse_targets(["http://h/v1/embeddings?x=1"], [], "M")  # '=' in the URL
    assert c.name == "h" and c.url.endswith("x=1")


@pytest.mark.parametrize(
    ("targets", "models", "says"),
    [
        (["not-a-url"], [], "[NAME=]http"),
        (["x=ftp://h/e"], [], "[NAME=]http"),
        (["x=http://h:99999/e"], [], "Port out of range"),
        ([f"x={URL}", f"x={URL}"], [], "two targets"),
        ([], [], "at least one"),
        ([f"x={URL}"], ["y=m"], "names no --target: y"),
        ([f"x={URL}"], ["x"], "NAME=MODEL"),
    ],
)
def test_bad_targets_say_why(targets: list[str], models: list[str], says: str) -> None:
    with pytest.raises(TargetError) as info:
        parse_targets(targets, models, "M")
    assert says in str(info.value) and "\n" not in str(info.value)


def test_requests_cycle_through_the_texts() -> None:
    reqs = requests_of(["a", "b", "c"], [1, 2, 3], 2)
    assert reqs == [(["a", "b"], 3), (["c", "a"], 4), (["b", "c"], 5)]


def _result() -> TargetResult:
    pts = [KneePoint(r, r, 64 * r, 64 * r, 10.0, 20.0 + r, 0) for r in (1.0, 2.0, 4.0)]
    nan = KneePoint(8.0, 0.0, 0.0, 0.0, float("nan"), float("nan"), 9)
    r = TargetResult("a|b", URL, "M", rates=[1, 2, 4, 8], points=[*pts, nan])
    r.knee = find_knee(r.points, slo_ms=100)
    return r


def test_report_files_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    r = _result()
    md = markdown([r], "header", ["a note"])
    paths = write(tmp_path, "k", {"slo_ms": 100, "x": float("inf")}, md, [r], "title")
    assert [p.name for p in paths] == ["k.json", "k.md"]
    data = json.loads((tmp_path / "k.json").read_text())  # strict JSON: no NaN
    assert data["x"] is None
    assert "a note" in (tmp_path / "k.md").read_text()


def test_markdown_and_numbers() -> None:
    md = markdown([_result()], "header", [])
    assert "| a\\|b | 4 | 256 | 24 | - |" in md  # the knee row, its | escaped
    assert [fmt(x) for x in (None, float("nan"), 0.5, 12.34, 1234.5)] == [
        "-",
        "-",
        "0.5",
        "12.3",
        "1,234",
    ]
