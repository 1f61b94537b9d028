"""GGUF conversion: once, atomically, into the cache; the ``gguf:`` source kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fleetserve.catalog import gguf as convert
from fleetserve.catalog.sources import locate, resolve
from fleetserve.wire import ModelNotFound

from ..extras import needs


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    f = tmp_path / "pkg" / "tiny.Q4_1.gguf"
    f.parent.mkdir()
    f.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    return f


def _fake_convert(calls: list[Path]) -> Any:
    def run(gguf: Path, out: Path, console: Console) -> None:
        calls.append(gguf)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")
        (out / convert.MARKER).write_text("{}")

    return run


def test_a_crash_mid_conversion_leaves_no_cache(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(gguf: Path, out: Path, console: Console) -> None:
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "_convert", crash)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        convert.convert_gguf(gguf, cache)
    assert list((cache / "gguf").iterdir()) == []  # neither the result nor the temp dir
    assert not convert.is_converted(convert.converted_path(gguf, cache))


def test_converts_once_then_reuses_the_cache(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(convert, "_convert", _fake_convert(calls))
    cache = tmp_path / "cache"
    first = convert.convert_gguf(gguf, cache)
    second = convert.convert_gguf(gguf, cache)
    assert first == second and calls == [gguf]
    assert (first / "model.safetensors").read_bytes() == b"weights"
    assert first.parent == cache / "gguf" and first.name.startswith("tiny.Q4_1-")
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp left over
    # the key is the content: a changed file converts again
    gguf.write_bytes(gguf.read_bytes() + b"x")
    assert convert.convert_gguf(gguf, cache) != first and len(calls) == 2


def test_the_gguf_source_kind_converts_on_resolve_and_is_located_before(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(convert, "_convert", _fake_convert(calls))
    cache, hub = tmp_path / "cache", tmp_path / "hub"
    sources = ("gguf:" + str(tmp_path / "absent.gguf"), f"gguf:{gguf}")
    assert locate(sources, hub, cache) == gguf.parent  # present, not converted yet
    path = resolve("m", sources, hub, cache_dir=cache)
    assert calls == [gguf] and convert.is_converted(path)
    assert locate(sources, hub, cache) == path
    with pytest.raises(ModelNotFound) as e:
        resolve("m", sources[:1], hub, cache_dir=cache)
    assert "absent.gguf" in e.value.message and "no such file" in e.value.message
    with pytest.raises(ModelNotFound, match="not installed"):
        resolve("m", ("gguf:package:fleetserve_no_such_pkg/x.gguf",), hub, cache_dir=cache)


@pytest.mark.slow  # a child process that imports transformers
def test_the_conversion_child_writes_nothing_to_the_servers_stderr(
    gguf: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Its bars and warnings stay in the child (JSON logs stay JSON); a failure comes
    back as one error with the child's last line."""
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RuntimeError, match=r"converting tiny.Q4_1.gguf failed: \S"):
        convert._convert(gguf, out, Console(stderr=True))
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


@needs("gguf", extra="generate")
def test_the_conversion_child_builds_each_name_map_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers asks gguf for the tensor-name map once per submodule; the child
    builds it once per architecture and depth (a map is only read once built)."""
    import gguf as lib

    built: list[tuple[Any, int]] = []

    def build(arch: Any, n_blocks: int) -> object:
        built.append((arch, n_blocks))
        return object()

    monkeypatch.setattr(lib, "get_tensor_name_map", build)
    convert._one_name_map_per_shape()
    arch = lib.MODEL_ARCH.LLAMA
    first = lib.get_tensor_name_map(arch, 30)
    assert lib.get_tensor_name_map(arch, 30) is first
    assert lib.get_tensor_name_map(arch, 2) is not first
    assert built == [(arch, 30), (arch, 2)]
