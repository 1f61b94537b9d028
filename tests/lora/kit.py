"""What the adapter tests share: a tiny BERT base, adapters made on it, registries over
each store (memory, file, NATS), and helpers to read an adapter and list a store."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetserve.lora.bases import StaticBases
from fleetserve.lora.registry import AdapterRegistry
from fleetserve.lora.shapes import linear_shapes
from fleetserve.lora.store import AdapterStore
from fleetserve.lora.validate import CONFIG, WEIGHTS, Limits
from fleetserve.storage import FileStore, MemoryStore
from fleetserve.wire import Principal, Scope
from tests.tiny_lora import make_lora
from tests.tinymodels import build_bert

BASE = "tiny/bert"
OTHER = "tiny/other-bert"  # a second served model with the same shapes
IMAGE = "tiny/image"  # a served model of a family that takes no adapters
STORES = ["memory", "file", "nats"]

ALICE = Principal("alice", frozenset({Scope.INFER, Scope.ADAPTERS_WRITE}))
BOB = Principal("bob", frozenset({Scope.INFER, Scope.ADAPTERS_WRITE}))
READER = Principal("alice", frozenset({Scope.INFER}))
ADMIN = Principal("ops", frozenset({Scope.ADMIN}))


@dataclass(frozen=True)
class Files:
    """An adapter's two files, as bytes, and the directory they came from."""

    dir: Path
    config: bytes
    weights: bytes

    def with_config(self, **changes: Any) -> bytes:
        config = json.loads(self.config)
        config.update(changes)
        return json.dumps(config).encode()


def lora(base_dir: Path, out: Path, *, base_name: str = BASE, **kwargs: Any) -> Files:
    """make_lora, then ``base_model_name_or_path`` set to ``base_name`` (given to PEFT,
    a name that is not a path makes it look the model up online)."""
    make_lora(base_dir, out, **kwargs)
    config = json.loads((out / CONFIG).read_text())
    config["base_model_name_or_path"] = base_name
    (out / CONFIG).write_text(json.dumps(config, indent=2))
    return read(out)


def read(path: Path) -> Files:
    return Files(path, (path / CONFIG).read_bytes(), (path / WEIGHTS).read_bytes())


@dataclass(frozen=True)
class Kit:
    base_dir: Path
    shapes: dict[str, tuple[int, int]]
    lora: Files  # rank 4 on query and value
    lora2: Files  # another adapter (rank 8, other seed)
    work: Path

    def make(self, name: str, **kwargs: Any) -> Files:
        return lora(self.base_dir, self.work / f"{name}-{uuid.uuid4().hex[:6]}", **kwargs)

    def bases(self) -> StaticBases:
        return StaticBases(
            {
                BASE: ("dense", self.shapes),
                OTHER: ("cross_encoder", self.shapes),
                IMAGE: ("image", {}),
            }
        )


@pytest.fixture(scope="session", name="kit")
def kit_fixture(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    root = tmp_path_factory.mktemp("lora-kit")
    base = build_bert(root / "bert")
    one = lora(base, root / "a", rank=4)
    two = lora(base, root / "b", rank=8, seed=2)
    return Kit(base, linear_shapes(base), one, two, root)


def registry_on(store: AdapterStore, kit: Kit, **limits: Any) -> AdapterRegistry:
    return AdapterRegistry(store, limits=Limits(**limits), bases=kit.bases())


@pytest.fixture(params=STORES, name="store")
async def store_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[AdapterStore]:
    """An empty adapter store of each kind (NATS: a fresh bucket on the session server)."""
    if request.param == "memory":
        yield AdapterStore(MemoryStore())
        return
    if request.param == "file":
        yield AdapterStore(FileStore(tmp_path / "adapter-store"))
        shutil.rmtree(tmp_path / "adapter-store", ignore_errors=True)
        return
    import nats

    from fleetserve.storage.nats import NatsObjectStore

    server = request.getfixturevalue("nats_server")
    nc = await nats.connect(server.url)
    bucket = f"adapters-{uuid.uuid4().hex[:12]}"
    try:
        yield AdapterStore(await NatsObjectStore.open(nc, bucket, storage="memory"))
    finally:
        await nc.jetstream().delete_object_store(bucket)
        await nc.close()
