"""``fleetserve models``: the live fleet or the catalog, readable at 80 columns; and
``prepare``: convert, fetch and export ahead of serving."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from fleetserve.catalog import Catalog
from fleetserve.cli_models import list_models

from . import forked
from .conftest import ServerThread, tiny_settings
from .tinymodels import build_bert, write_spec

pytestmark = pytest.mark.slow  # seconds each: `make test-fast` leaves it out


def run(*args: str, cwd: Path, columns: str = "200") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"} | ({"COLUMNS": columns} if columns else {})
    return forked.run(
        [sys.executable, "-m", "fleetserve", "models", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=env,
    )


def rich_text(s: str) -> str:
    """What a terminal shows: the text without its colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", s)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port no server answers on: bound here and not listening, for the test (a port
    let go at once may go to a server that a test beside it starts meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def test_offline_listing_piped_is_tab_separated_and_on_a_terminal_fits_it(
    tmp_path: Path, closed_port: int
) -> None:
    model = build_bert(tmp_path / "model")
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/dense", model)
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4)
    long_id = "tiny/absent-with-a-long-name-" + "x" * 40
    write_spec(cat, long_id, deep / "nowhere", size="33M params")
    port = closed_port
    flags = ["--catalog", str(cat), "--port", str(port)]
    r = run(*flags, cwd=tmp_path, columns="")  # piped: one line per model, tab-separated
    assert r.returncode == 0, r.stderr
    header, *lines = r.stdout.splitlines()
    assert header.split("\t") == ["model", "family", "state", "size", "pinned", "runs_on", "where"]
    rows = {line.split("\t")[0]: line.split("\t") for line in lines}
    dense, absent = rows["tiny/dense"], rows[long_id]  # the whole id, never cut
    assert dense[2] == "cold" and re.fullmatch(r"\d+\.\d MiB", dense[3]) and dense[6] == str(model)
    assert absent[2] == "absent" and absent[3].startswith("~") and absent[3].endswith(" MiB")
    assert absent[6] == f"no weights at {deep / 'nowhere'}"  # the whole path
    assert "KiB" not in r.stdout and not re.search(r"\d MB\b", r.stdout)  # one unit
    assert f"no server on 127.0.0.1:{port}: showing the catalog" in r.stderr  # not in the data
    as_json = run(*flags, "--json", cwd=tmp_path)
    listed = {m["model"]: m for m in json.loads(as_json.stdout)}
    assert listed[long_id]["state"] == "absent" and listed["tiny/dense"]["where"] == str(model)
    for width in (80, 400):  # a terminal: nothing cut, no line past its width
        out = io.StringIO()
        settings = tiny_settings(cat, port=port, models="")
        list_models(settings, Console(file=out, width=width, force_terminal=True))
        text = rich_text(out.getvalue())
        assert all(len(line) <= width for line in text.splitlines()), text
        assert long_id in text and "absent" in text and "runs on" in text
        nowhere = f"no weights at {deep / 'nowhere'}"  # folded over lines at 80, not cut
        assert nowhere in (text if width == 400 else text.replace("\n", ""))


def test_live_listing_shows_what_is_resident_and_what_is_cold(tmp_path: Path) -> None:
    model = build_bert(tmp_path / "model")
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/dense", model)
    write_spec(cat, "tiny/lazy", model)
    settings = tiny_settings(cat, models="tiny/dense", api_key="sesame")
    srv = ServerThread(settings, catalog=Catalog.load([cat], bundled=False)).start()
    try:
        assert srv.server is not None
        port = srv.server.port
        out = io.StringIO()
        ours = tiny_settings(cat, port=port, api_key="sesame", models="")
        assert list_models(ours, Console(file=out, width=80, force_terminal=True)) == 0
        lines = rich_text(out.getvalue()).splitlines()
        assert all(len(line) <= 80 for line in lines), out.getvalue()
        assert f"live, 127.0.0.1:{port}" in lines[0]
        [dense] = [line for line in lines if line.startswith("tiny/dense")]
        [lazy] = [line for line in lines if line.startswith("tiny/lazy")]
        assert " resident " in dense and " cold " in lazy, out.getvalue()
        assert "torch fp32" in dense
        assert "showing the catalog" not in out.getvalue()
        wrong = io.StringIO()
        list_models(
            tiny_settings(cat, port=port, api_key="wrong", models=""),
            Console(file=wrong, width=80, force_terminal=True),
        )
        assert "refused the API key (401): showing the catalog" in wrong.getvalue()
    finally:
        srv.stop()


def test_prepare_exports_for_onnx_into_the_cache_and_reports_absent_models(
    tmp_path: Path,
) -> None:
    model = build_bert(tmp_path / "model")
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/dense", model)
    write_spec(cat, "tiny/absent", tmp_path / "nowhere")
    cache = tmp_path / "cache"
    flags = ["--catalog", str(cat), "--cache-dir", str(cache), "--device", "cpu"]
    r = run("prepare", "tiny/dense", "--runtime", "onnx", *flags, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ready tiny/dense (onnx, fp32)" in r.stderr
    assert list((cache / "onnx").rglob("*.onnx")), "the export is cached"
    bad = run("prepare", "tiny/absent", *flags, cwd=tmp_path)
    assert bad.returncode == 1
    assert "tiny/absent" in bad.stderr and "not present locally" in bad.stderr
    unknown = run("prepare", "tiny/nope", *flags, cwd=tmp_path)  # no server here to name
    assert unknown.returncode == 1 and "unknown model 'tiny/nope'" in unknown.stderr
    assert "tiny/dense" in unknown.stderr.partition("known models: ")[2]
    assert "server" not in unknown.stderr, unknown.stderr
    none = run("prepare", *flags, cwd=tmp_path)
    assert none.returncode == 2 and "name the models" in none.stderr


def test_prepare_converts_for_openvino_at_the_asked_precision(tmp_path: Path) -> None:
    model = build_bert(tmp_path / "model")
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/dense", model)
    cache = tmp_path / "cache"
    flags = ["--catalog", str(cat), "--cache-dir", str(cache), "--device", "cpu"]
    r = run("prepare", "tiny/dense", "--runtime", "openvino", "--precision", "bf16", *flags,
            cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    # bf16 where the CPU has bf16 kernels (AVX512-BF16, AMX); else what runs, fp32
    assert re.search(r"ready tiny/dense \(openvino, (bf16|fp32)\)", r.stderr), r.stderr
    [entry] = (cache / "openvino").iterdir()
    assert {p.name for p in entry.iterdir()} == {"model.xml", "model.bin", "meta.json", "compiled"}
    assert list((entry / "compiled" / "bf16").glob("*.blob")), "the compiled model is kept too"
    again = run("prepare", "tiny/dense", "--runtime", "openvino", "--precision", "fp16", *flags,
                cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert [p.name for p in (cache / "openvino").iterdir()] == [entry.name]  # one IR for all
    bad = run("prepare", "tiny/dense", "--runtime", "openvino", "--precision", "int8", *flags,
              cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 1 and "int8 is not offered" in bad.stderr


def test_the_fleet_fields_of_v1_models_show_state_size_pins_failures_and_workers() -> None:
    from fleetserve.cli_models import live_rows, print_table

    mib = 2**20
    entries = [
        {"id": "a/resident", "family": "dense", "state": "resident", "bytes": 150 * mib,
         "pinned": True, "runtime": "torch", "precision": "fp32", "keep_alive": 300},
        {"id": "b/failed", "family": "ner", "state": "failed", "bytes": 0, "pinned": False,
         "error": "weights not present locally", "runtime": "onnx"},
        {"id": "c/distributed", "family": "dense", "runtime": "torch", "bytes": 90 * mib,
         "workers": [
             {"id": "host-1-" + "w" * 60, "ready": True, "state": "resident", "bytes": 90 * mib},
             {"id": "host-2", "ready": True, "state": "loading", "bytes": 0},
             {"id": "host-3", "ready": True, "state": "cold", "bytes": 0},
         ]},
        {"id": "d/older-server", "family": "dense", "loaded": True},
    ]  # fmt: skip
    rows, failures = live_rows(entries)
    by = {r.model: r for r in rows}
    assert by["a/resident"].state == "resident" and by["a/resident"].size == "150.0 MiB"
    assert by["a/resident"].pinned and by["a/resident"].runs_on == "torch fp32"
    assert by["b/failed"].state == "failed" and by["b/failed"].size == "?"
    assert failures == [("b/failed", "weights not present locally")]
    assert by["c/distributed"].state == "resident"  # no top-level state: from its workers
    assert by["c/distributed"].where.endswith("host-2 (loading)")
    assert "host-3" not in by["c/distributed"].where
    assert by["d/older-server"].state == "resident"  # from `loaded`
    out = io.StringIO()
    print_table(Console(file=out, width=80, force_terminal=True), "t", rows)
    text = rich_text(out.getvalue())
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "where: host-1-" + "w" * 60 in text.replace("\n", "")  # folded, not cut
