"""Model weights from an object store (a real local S3 server): fetched once, then cached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fleetserve.catalog.fetch import ObjectStoreConfig, cached_path
from fleetserve.catalog.sources import is_present, resolve
from fleetserve.wire import ModelNotFound

from ..storage.conftest import S3Server, s3_server  # noqa: F401 - the session fixture
from ..tinymodels import build_bert


def upload(server: S3Server, src: Path, prefix: str) -> None:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        server.bucket,
        config={
            "endpoint": server.endpoint,
            "region": "us-east-1",
            "access_key_id": server.access_key_id,
            "secret_access_key": server.secret_access_key,
        },
        client_options={"allow_http": True},
    )
    for f in src.rglob("*"):
        if f.is_file():
            obstore.put(store, f"{prefix}/{f.relative_to(src)}", f.read_bytes())


def config(server: S3Server) -> ObjectStoreConfig:
    return ObjectStoreConfig(
        server.endpoint, "us-east-1", server.access_key_id, server.secret_access_key
    )


def test_an_s3_source_is_fetched_once_then_served_from_the_cache(
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    model = build_bert(tmp_path / "model")
    upload(s3_server, model, "models/tiny-bert")
    uri = f"s3://{s3_server.bucket}/models/tiny-bert"
    cache = tmp_path / "cache"
    hf = tmp_path / "hf"
    assert not is_present((uri,), hf, cache)  # not fetched yet: not present locally
    path = resolve("tiny", (uri,), hf, cache_dir=cache, objects=config(s3_server))
    assert path == cached_path(uri, cache) and is_present((uri,), hf, cache)
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in model.iterdir())
    a = (path / "model.safetensors").read_bytes()
    assert a == (model / "model.safetensors").read_bytes()
    # a second resolve does not need the store at all
    again = resolve("tiny", (uri,), hf, cache_dir=cache, objects=ObjectStoreConfig("http://0:1"))
    assert again == path

    from fleetserve.catalog import ModelSpec
    from fleetserve.families.dense import DenseFamily
    from fleetserve.runtimes import create_runtime

    spec = ModelSpec(id="tiny", family="dense", runtime="torch", sources=(uri,), max_seq_len=16)
    adapter = DenseFamily(spec, create_runtime("torch", device="cpu", precision="fp32"), path)
    adapter.load()
    out = adapter.forward([[2, 30, 3]])
    assert np.isfinite(out).all() and out.shape == (1, 32)


def test_a_missing_prefix_is_a_clear_not_found(
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    uri = f"s3://{s3_server.bucket}/models/never-uploaded"
    with pytest.raises(ModelNotFound) as info:
        resolve("x", (uri,), tmp_path, cache_dir=tmp_path / "c", objects=config(s3_server))
    assert "never-uploaded" in info.value.message and "no objects" in info.value.message
    assert not (tmp_path / "c" / "objects").exists() or not any(
        (tmp_path / "c" / "objects").iterdir()
    )
