"""The profile chooses the runtime: the same dense model served on torch, ONNX and OpenVINO."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from fleetserve.catalog import Catalog

from ..conftest import ServerThread, tiny_settings
from ..tinymodels import build_bert, write_spec

PROFILE = {"max_batch_tokens": 256, "max_batch_size": 8}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("profile-runtime")
    model = build_bert(root / "model")
    cat = root / "catalog"
    write_spec(cat, "tiny/torch", model)
    write_spec(cat, "tiny/onnx", model, profiles={"cpu": {"runtime": "onnx", **PROFILE}})
    int8 = {"cpu": {"runtime": "onnx", "precision": "int8", **PROFILE}}
    write_spec(cat, "tiny/onnx-int8", model, profiles=int8)
    write_spec(cat, "tiny/openvino", model, profiles={"cpu": {"runtime": "openvino", **PROFILE}})
    settings = tiny_settings(cat, models="tiny/torch,tiny/onnx,tiny/onnx-int8,tiny/openvino")
    settings = type(settings).load(
        overrides={**{k: getattr(settings, k) for k in ("port", "catalog", "models", "device")},
                   "cache_dir": str(root / "cache")}
    )  # fmt: skip
    srv = ServerThread(settings, Catalog.load([cat], bundled=False)).start()
    yield srv
    srv.stop()


def embed(srv: ServerThread, model: str) -> np.ndarray:
    texts = ["the quick brown fox", "a lazy dog sat on the mat", "river bank money"]
    r = httpx.post(f"{srv.url}/v1/encode/{model}", json={"inputs": texts}, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"])


def test_the_profile_picks_onnx_and_it_agrees_with_torch(server: ServerThread) -> None:
    info = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert info["tiny/torch"]["runtime"] == "torch"
    assert info["tiny/onnx"]["runtime"] == "onnx"
    assert server.server is not None
    onnx_rt = server.server.runners["tiny/onnx"].family.runtime  # type: ignore[attr-defined]
    assert onnx_rt.name == "onnx"
    a, b = embed(server, "tiny/torch"), embed(server, "tiny/onnx")
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.9999


def test_the_profile_picks_openvino_and_it_agrees_with_torch(server: ServerThread) -> None:
    info = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert info["tiny/openvino"]["runtime"] == "openvino"
    assert server.server is not None
    rt = server.server.runners["tiny/openvino"].family.runtime  # type: ignore[attr-defined]
    assert rt.name == "openvino" and rt.precision == "fp32"
    a, b = embed(server, "tiny/torch"), embed(server, "tiny/openvino")
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.9999
    assert list((Path(server.settings.cache_dir) / "openvino").glob("*/model.xml"))


def test_int8_is_kept_when_the_guard_passes(server: ServerThread) -> None:
    assert server.server is not None
    rt = server.server.runners["tiny/onnx-int8"].family.runtime  # type: ignore[attr-defined]
    assert rt.name == "onnx" and rt.precision == "int8"  # the tiny model passes at 0.999
    a, b = embed(server, "tiny/torch"), embed(server, "tiny/onnx-int8")
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.999


def test_the_cache_is_where_settings_say(server: ServerThread, tmp_path: Path) -> None:
    assert server.server is not None
    cache = Path(server.settings.cache_dir)
    assert list((cache / "onnx").rglob("*.onnx"))
