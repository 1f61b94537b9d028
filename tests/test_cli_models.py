"""``fleetserve models prepare``: convert, fetch and export ahead of serving."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .tinymodels import build_bert, write_spec


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetserve", "models", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


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
