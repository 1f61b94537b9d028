"""Adapters declared in a model spec: parsed strictly, resolved like model sources (a
directory, the HF cache layout, s3://), registered idempotently at start."""

from __future__ import annotations

import asyncio
import logging
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.catalog.adapter_specs import AdapterDecl
from fleetserve.lora.declared import register_declared
from fleetserve.lora.store import AdapterStore
from fleetserve.settings import Settings
from fleetserve.storage import MemoryStore

from .kit import BASE, Kit, kit_fixture, registry_on  # noqa: F401


def spec(*adapters: dict[str, Any]) -> ModelSpec:
    return ModelSpec.from_dict({"id": BASE, "sources": ["/nowhere"], "adapters": list(adapters)})


def settings(tmp_path: Path, **extra: Any) -> Settings:
    over = {"cache_dir": str(tmp_path / "cache"), "hf_cache": str(tmp_path / "hf"), **extra}
    return Settings.load(overrides=over)


def copy(src: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(src / name, dest / name)
    return dest


def test_declarations_parse_strictly() -> None:
    s = spec({"name": "public/legal-v1", "source": "hf:acme/legal", "pinned": True})
    assert s.adapters == (AdapterDecl("public/legal-v1", "hf:acme/legal", True),)
    assert ModelSpec.from_dict({"id": "m", "sources": ["/x"]}).adapters == ()
    bad = [
        ({"name": "t/a", "source": "/x", "color": 1}, "adapters[0]: unknown key 'color'"),
        ({"source": "/x"}, "key 'name'"),
        ({"name": "no-tenant", "source": "/x"}, "is not 'tenant/name'"),
        ({"name": "t/a@2", "source": "/x"}, "takes no version"),
        ({"name": "t/a"}, "key 'source' is required"),
        ({"name": "t/a", "source": "gguf:/m.gguf"}, "adapters come from"),
        ({"name": "t/a", "source": "/x", "pinned": "yes"}, "'pinned' must be true or false"),
    ]
    for item, words in bad:
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            spec(item)
    with pytest.raises(ValueError, match="declared twice"):
        spec({"name": "t/a", "source": "/x"}, {"name": "t/a", "source": "/y"})
    with pytest.raises(ValueError, match="must be a list"):
        ModelSpec.from_dict({"id": "m", "sources": ["/x"], "adapters": {"name": "t/a"}})


async def test_registered_once_then_kept_then_versioned(kit: Kit, tmp_path: Path) -> None:
    folder = copy(kit.lora.dir, tmp_path / "legal")
    catalog = Catalog([spec({"name": "public/legal", "source": str(folder), "pinned": True})])
    reg = registry_on(AdapterStore(MemoryStore()), kit)
    (first,) = await register_declared(reg, catalog, settings(tmp_path))
    assert str(first.id) == "public/legal@1" and first.pinned and first.base == BASE
    (again,) = await register_declared(reg, catalog, settings(tmp_path))
    assert again.id == first.id and await reg.count("public") == 1
    copy(kit.lora2.dir, folder)  # the files changed
    (changed,) = await register_declared(reg, catalog, settings(tmp_path))
    assert str(changed.id) == "public/legal@2" and changed.rank == 8
    copy(kit.lora.dir, folder)  # back to the first: that version is kept
    (back,) = await register_declared(reg, catalog, settings(tmp_path))
    assert back.id == first.id and await reg.count("public") == 2


async def test_the_hf_cache_layout(kit: Kit, tmp_path: Path) -> None:
    repo = tmp_path / "hf" / "models--acme--legal-lora"
    copy(kit.lora.dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    catalog = Catalog([spec({"name": "acme/legal", "source": "hf:acme/legal-lora"})])
    reg = registry_on(AdapterStore(MemoryStore()), kit)
    (info,) = await register_declared(reg, catalog, settings(tmp_path))
    assert str(info.id) == "acme/legal@1" and not info.pinned


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    """moto's S3 on a free loopback port, with a bucket ``loras``."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/loras", method="PUT")).close()
        yield endpoint
    finally:
        server.stop()


async def test_s3_sources(kit: Kit, tmp_path: Path, s3_endpoint: str) -> None:
    import obstore

    from fleetserve.storage.s3 import S3Store

    keys = {"access_key_id": "k", "secret_access_key": "s"}
    s3 = S3Store("loras", prefix="legal", endpoint=s3_endpoint, **keys)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        await obstore.put_async(s3.objects, name, (kit.lora.dir / name).read_bytes())
    catalog = Catalog([spec({"name": "public/s3-legal", "source": "s3://loras/legal"})])
    reg = registry_on(AdapterStore(MemoryStore()), kit)
    config = settings(tmp_path, s3_endpoint=s3_endpoint, **{f"s3_{k}": v for k, v in keys.items()})
    (info,) = await register_declared(reg, catalog, config)
    assert str(info.id) == "public/s3-legal@1"
    assert info.sha256 == (await reg.info("public/s3-legal")).sha256


async def test_a_bad_declaration_is_logged_and_skipped(
    kit: Kit, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(kit.lora.dir / "adapter_config.json", pickled)
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04.")
    good = copy(kit.lora.dir, tmp_path / "good")
    catalog = Catalog(
        [
            spec(
                {"name": "public/missing", "source": str(tmp_path / "nope")},
                {"name": "public/pickled", "source": str(pickled)},
                {"name": "public/good", "source": str(good)},
            )
        ]
    )
    reg = registry_on(AdapterStore(MemoryStore()), kit)
    with caplog.at_level(logging.ERROR, logger="fleetserve.lora"):
        infos = await register_declared(reg, catalog, settings(tmp_path))
    assert [str(i.id) for i in infos] == ["public/good@1"]
    text = caplog.text
    assert "public/missing of tiny/bert is not registered" in text and "not present" in text
    assert "public/pickled" in text and "adapter_model.bin: pickled" in text


async def test_two_servers_starting_at_once_agree(kit: Kit, tmp_path: Path) -> None:
    folder = copy(kit.lora.dir, tmp_path / "legal")
    catalog = Catalog([spec({"name": "public/legal", "source": str(folder)})])
    store = AdapterStore(MemoryStore())
    a, b = registry_on(store, kit), registry_on(store, kit)
    ra, rb = await asyncio.gather(
        register_declared(a, catalog, settings(tmp_path)),
        register_declared(b, catalog, settings(tmp_path)),
    )
    assert [i.id for i in ra] == [i.id for i in rb]
    assert await a.count("public") == 1
