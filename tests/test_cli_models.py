"""``fleetserve models``: the live fleet or the catalog, readable at 80 columns; and
``prepare``: convert, fetch and export ahead of serving."""

from __future__ import annotations

import io
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from fleetserve.catalog import Catalog
from fleetserve.cli_models import list_models

from .conftest import ServerThread, tiny_settings
from .tinymodels import build_bert, write_spec

pytestmark = pytest.mark.slow  # seconds each: `make test-fast` leaves it out


def run(*args: str, cwd: Path, columns: str = "200") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"} | ({"COLUMNS": columns} if columns else {})
    return subprocess.run(
        [sys.executable, "-m", "fleetserve", "models", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=env,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_offline_listing_shows_the_catalog_cold_in_80_columns_when_piped(
    tmp_path: Path,
) -> None:
    model = build_bert(tmp_path / "model")
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/dense", model)
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4)
    write_spec(cat, "tiny/absent-with-a-long-name-" + "x" * 40, deep / "nowhere", size="33M params")
    port = free_port()
    flags = ["--catalog", str(cat), "--port", str(port)]
    r = run(*flags, cwd=tmp_path, columns="")  # piped, no COLUMNS: rich's 80
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), r.stdout
    [dense] = [line for line in lines if line.startswith("tiny/dense")]
    assert re.search(r"\bcold\b", dense) and re.search(r"\d+\.\d MiB", dense), dense
    [absent] = [line for line in lines if line.startswith("tiny/absent")]
    assert "…" in absent and absent.split()[0].endswith("x" * 10)  # the id's end is kept
    assert "~" in absent and " MiB" in absent  # declared in parameters: fp32 bytes, roughly
    assert "KiB" not in r.stdout and not re.search(r"\d MB\b", r.stdout)  # one unit
    assert f"no server on 127.0.0.1:{port}: showing the catalog" in r.stdout
    wide = run(*flags, cwd=tmp_path, columns="400")
    assert str(model) in wide.stdout and "runs on" in wide.stdout  # room for where, runs on
    middle = run(*flags, cwd=tmp_path, columns="180").stdout.splitlines()
    assert all(len(line) <= 180 for line in middle)
    [absent] = [line for line in middle if line.startswith("tiny/absent")]
    assert "runs on" in middle[1] and "where" in middle[1]
    assert "…" in absent.split()[-1] and absent.endswith("/nowhere")  # where, cut in the middle


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
        assert list_models(ours, Console(file=out, width=80)) == 0
        lines = out.getvalue().splitlines()
        assert all(len(line) <= 80 for line in lines), out.getvalue()
        assert f"live, 127.0.0.1:{port}" in lines[0]
        [dense] = [line for line in lines if line.startswith("tiny/dense")]
        [lazy] = [line for line in lines if line.startswith("tiny/lazy")]
        assert " resident " in dense and " cold " in lazy, out.getvalue()
        assert "torch fp32" in dense
        assert "showing the catalog" not in out.getvalue()
        wrong = io.StringIO()
        list_models(
            tiny_settings(cat, port=port, api_key="wrong", models=""), Console(file=wrong, width=80)
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
    assert {p.name for p in entry.iterdir()} == {"model.xml", "model.bin", "meta.json"}
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
    print_table(Console(file=out, width=80), "t", rows)
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), out.getvalue()
    assert "where" in lines[1]  # the workers column stays, cut to fit
