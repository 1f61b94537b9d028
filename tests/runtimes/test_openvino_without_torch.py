"""With an OpenVINO IR cached, fleetserve serves on OpenVINO without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .. import forked
from ..tinymodels import build_bert

pytestmark = pytest.mark.slow  # seconds each: `make test-fast` leaves it out


SERVE_WITHOUT_TORCH = r"""
import asyncio, sys
sys.modules["torch"] = None  # any import of torch now fails
sys.modules["transformers"] = None
import httpx
from rich.console import Console
from fleetserve.server import EmbeddedServer
from fleetserve.settings import Settings

async def main():
    settings = Settings.load(overrides={"port": 0, "catalog": sys.argv[1], "models": "tiny/ov",
                                        "cache_dir": sys.argv[2], "tune": "off"})  # device: "auto"
    server = EmbeddedServer(settings, console=Console(quiet=True))
    await server.start()
    try:
        async with httpx.AsyncClient() as c:
            r = await c.post(f"http://127.0.0.1:{server.port}/v1/encode/tiny/ov",
                             json={"inputs": ["the quick fox"]})
        rt = server.runners["tiny/ov"].family.runtime
        print(r.status_code, len(r.json()["embeddings"][0]), rt.name)
    finally:
        await server.stop()
    assert "torch" not in [m for m, v in sys.modules.items() if v is not None]

asyncio.run(main())
"""


def test_a_cached_openvino_model_serves_with_torch_blocked(tmp_path: Path) -> None:
    model = build_bert(tmp_path / "model")
    cat = tmp_path / "catalog"
    cat.mkdir()
    spec = {"id": "tiny/ov", "family": "dense", "runtime": "openvino", "sources": [str(model)],
            "max_seq_len": 16,
            "profiles": {"cpu": {"runtime": "openvino", "max_batch_tokens": 256}}}  # fmt: skip
    (cat / "tiny.yaml").write_text(yaml.safe_dump(spec))
    cache = tmp_path / "cache"
    prepare = [sys.executable, "-m", "fleetserve", "models", "prepare", "tiny/ov",
               "--catalog", str(cat), "--cache-dir", str(cache), "--device", "cpu"]  # fmt: skip
    r = forked.run(prepare, capture_output=True, text=True, timeout=180)  # (torch is fine here)
    assert r.returncode == 0, r.stderr
    assert list((cache / "openvino").glob("*/model.xml")), "the IR is cached"
    served = subprocess.run(
        [sys.executable, "-c", SERVE_WITHOUT_TORCH, str(cat), str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode == 0, served.stderr[-2000:]
    assert served.stdout.split() == ["200", "32", "openvino"]
