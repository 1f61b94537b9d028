"""Adapters from spooled files: validated from the file (its safetensors header within
``max_header_bytes``), moved or streamed into every kind of store, never read whole."""

from __future__ import annotations

import errno
import hashlib
import os
import struct
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleetserve.lora import store as store_module
from fleetserve.lora.safetensors_header import read_file_header
from fleetserve.lora.store import AdapterStore
from fleetserve.lora.validate import Limits, WeightsFile, validate
from fleetserve.storage.s3 import S3Store
from fleetserve.wire import InvalidInput

from ..storage.conftest import S3Server, s3_server  # noqa: F401
from .kit import ALICE, BASE, Kit, kit_fixture, registry_on, store_fixture  # noqa: F401


def spool(tmp_path: Path, data: bytes) -> WeightsFile:
    path = tmp_path / f".upload-{uuid.uuid4().hex}.tmp"
    path.write_bytes(data)
    return WeightsFile(path, len(data), hashlib.sha256(data).hexdigest())


@pytest.fixture
async def s3_store(s3_server: S3Server) -> AsyncIterator[AdapterStore]:  # noqa: F811
    made = S3Store(
        s3_server.bucket,
        prefix=f"t-{uuid.uuid4().hex}",
        endpoint=s3_server.endpoint,
        access_key_id=s3_server.access_key_id,
        secret_access_key=s3_server.secret_access_key,
    )
    yield AdapterStore(made)
    await made.close()


async def test_a_spooled_adapter_is_stored_from_its_file(
    store: AdapterStore, kit: Kit, tmp_path: Path
) -> None:
    """Before: the registry took the weights as bytes only (the whole upload in
    memory). Now a spooled file is validated from disk and put into each store (a file
    store renames it); what the store holds, and the sha256, are the upload's."""
    registry = registry_on(store, kit)
    weights = spool(tmp_path, kit.lora.weights)
    info = await registry.create(ALICE, "spooled", kit.lora.config, weights, base=BASE)
    assert info.manifest.weights_sha256 == hashlib.sha256(kit.lora.weights).hexdigest()
    assert info.manifest.bytes == len(kit.lora.config) + len(kit.lora.weights)
    assert await registry.files(info.id) == (kit.lora.config, kit.lora.weights)
    if store._kind == "file":
        assert not weights.path.exists()  # moved, not copied


async def test_put_file_streams_into_s3(s3_store: AdapterStore, tmp_path: Path) -> None:
    """S3 gets a streamed (multipart) put from the file; the object is the file's bytes
    (6 MiB: two of obstore's 5 MiB parts). Before: no put_file."""
    data = os.urandom(6 << 20)
    weights = spool(tmp_path, data)
    await s3_store.put_file("adapters/alice/x/1/adapter_model.safetensors", weights.path)
    assert await s3_store.get("adapters/alice/x/1/adapter_model.safetensors") == data


def test_a_move_across_file_systems_copies_then_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.replace across file systems fails with EXDEV: the spool is copied beside the
    target, then renamed over it, so readers never see part of a file."""
    src, dest = tmp_path / "spool.tmp", tmp_path / "store" / "k" / "w.safetensors"
    src.write_bytes(b"weights")
    real = os.replace
    calls: list[str] = []

    def replace(a: str | Path, b: str | Path) -> None:
        calls.append(Path(a).name)
        if Path(a) == src:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real(a, b)

    monkeypatch.setattr(store_module.os, "replace", replace)
    store_module._file_move(src, dest)
    assert dest.read_bytes() == b"weights"
    assert calls[0] == "spool.tmp" and calls[1].startswith(".w.safetensors.")
    assert [p.name for p in dest.parent.iterdir()] == ["w.safetensors"]


def test_a_header_over_the_limit_is_refused_from_its_first_bytes(tmp_path: Path) -> None:
    """A file declaring a 60 MB header is refused by its length alone (before, up to
    100 MiB of JSON was read and parsed); the message names the setting."""
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", 60_000_000) + b'{"a": ')  # the rest never comes
    with pytest.raises(InvalidInput, match="max_safetensors_header_bytes") as err:
        read_file_header(path, what="w", field="weights", max_header=4 << 20)
    assert "60000000" in err.value.message


def test_validate_reads_a_spooled_file_within_the_header_limit(kit: Kit, tmp_path: Path) -> None:
    """The same adapter validates from its file as from its bytes; a header limit
    below its header's size refuses it (400 naming max_safetensors_header_bytes)."""
    weights = spool(tmp_path, kit.lora.weights)
    shapes = kit.shapes
    from_file = validate(
        kit.lora.config, weights, base_model=BASE, base_shapes=shapes, limits=Limits()
    )
    from_bytes = validate(
        kit.lora.config, kit.lora.weights, base_model=BASE, base_shapes=shapes, limits=Limits()
    )
    assert from_file == from_bytes
    with pytest.raises(InvalidInput, match="max_safetensors_header_bytes"):
        validate(
            kit.lora.config, weights, base_model=BASE, base_shapes=shapes,
            limits=Limits(max_header_bytes=64),
        )  # fmt: skip


def test_a_deeply_nested_header_is_a_400(tmp_path: Path) -> None:
    """A header of 200,000 '[' (well within the size limit) made json.loads raise
    RecursionError, which nothing caught: a crashed request (500); now a 400."""
    raw = b"[" * 200_000
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(InvalidInput, match="nested too deeply"):
        read_file_header(path, what="w", field="weights", max_header=4 << 20)
