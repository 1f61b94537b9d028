"""The core install: ``pip install -e .`` with no extras, in a fresh venv, gives a
working CLI, and a server that says which extra each model needs."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .tinymodels import build_bert, write_spec
from .waiting import wait_for

pytestmark = pytest.mark.slow  # a venv and a pip install: seconds

ROOT = Path(__file__).resolve().parents[1]

# the modules that need an extra to import: a runtime's, a family's on its tokenizer
# or model library, the trainer's, the tracer's, the NATS store's. Every other module
# imports with the core dependencies alone.
EXTRA_BOUND = frozenset(
    {
        "fleetserve.families.cross_encoder",
        "fleetserve.families.dense",
        "fleetserve.families.extract",
        "fleetserve.families.generate.constrain",
        "fleetserve.families.generate.engine",
        "fleetserve.families.generate.loading",
        "fleetserve.families.generate.sampling",
        "fleetserve.families.gliner_decode",
        "fleetserve.families.gliner_model",
        "fleetserve.families.image",
        "fleetserve.families.image_preprocess",
        "fleetserve.families.multivector",
        "fleetserve.families.multivector_tokens",
        "fleetserve.families.ner",
        "fleetserve.families.span_ner",
        "fleetserve.families.sparse",
        "fleetserve.families.tokenize",
        "fleetserve.families.zero_shot",
        "fleetserve.families.zero_shot_embed",
        "fleetserve.families.zero_shot_nli",
        "fleetserve.lora.load",
        "fleetserve.lora.mixed",
        "fleetserve.runtimes.onnx",
        "fleetserve.runtimes.onnx_export",
        "fleetserve.runtimes.mapped",
        "fleetserve.runtimes.onnx_guard",
        "fleetserve.runtimes.onnx_lora",
        "fleetserve.runtimes.openvino",
        "fleetserve.runtimes.openvino_convert",
        "fleetserve.runtimes.torch",
        "fleetserve.storage.nats",
        "fleetserve.tracing.export",
        "fleetserve.tracing.otel",
    }
)

IMPORT_ALL = r"""
import importlib, pkgutil, sys
import fleetserve
for m in pkgutil.walk_packages(fleetserve.__path__, "fleetserve."):
    if m.name == "fleetserve.__main__":
        continue
    try:
        importlib.import_module(m.name)
    except ImportError as exc:
        print(m.name, "|", exc)
"""


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with fleetserve installed without extras: its bin directory."""
    venv = tmp_path_factory.mktemp("core") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(ROOT)]
    r = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return venv / "bin"


def _run(core: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{core}:/usr/bin:/bin", "COLUMNS": "100", "HOME": str(core.parent)}
    cmd = [str(core / "fleetserve"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_only_the_extras_modules_need_an_extra(core: Path) -> None:
    out = subprocess.run(
        [str(core / "python"), "-c", IMPORT_ALL], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    failed = dict(line.split(" | ", 1) for line in out.stdout.splitlines())
    assert set(failed) == EXTRA_BOUND, {m: failed.get(m) for m in set(failed) ^ EXTRA_BOUND}


def test_help_hardware_and_models_run_without_extras(core: Path) -> None:
    r = _run(core, "--help")
    assert r.returncode == 0 and "Serve fleets of small models." in r.stdout, r.stderr
    r = _run(core, "hardware")
    assert r.returncode == 0 and "hardware class: cpu-" in r.stdout, r.stderr
    r = _run(core, "models", "--port", "9")  # no server there: the catalog
    assert r.returncode == 0, r.stderr
    assert "sentence-transformers/all-MiniLM-L6-v2" in r.stdout
    r = _run(core, "cluster", "--port", "9")  # distributed mode names its extra
    assert r.returncode == 1 and "pip install 'fleetserve[nats]'" in r.stderr, r.stderr


@pytest.fixture
def serving(core: Path, tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """``fleetserve serve`` of the core venv over a tiny model's catalog: its URL and
    its log lines so far."""
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/core", build_bert(tmp_path / "model"))
    env = {"PATH": f"{core}:/usr/bin:/bin", "HOME": str(tmp_path)}
    cmd = [str(core / "fleetserve"), "serve", "--port", "0", "--catalog", str(cat),
           "--models", "", "--tune", "off", "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any(" ready: " in line for line in lines), 60, lambda: "".join(lines))
        port = next(m.group(1) for ln in lines if (m := re.search(r"listening on \S+:(\d+)", ln)))
        yield f"http://127.0.0.1:{port}", lines
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        proc.stderr.close()


def test_serve_says_which_extra_each_model_needs(serving: tuple[str, list[str]]) -> None:
    url, lines = serving
    hint = "pip install 'fleetserve[torch]' --extra-index-url https://download.pytorch.org/whl/cpu"
    need = [ln for ln in lines if "need fleetserve[torch]" in ln]  # the bundled ones too
    assert need and hint in need[0], "".join(lines)
    r = httpx.post(f"{url}/v1/encode/tiny/core", json={"inputs": ["hi"]}, timeout=30)
    assert r.status_code == 503, r.text
    assert hint in r.json()["error"]["message"]
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
