"""One contract, every payload store: memory, file, S3 (moto) and NATS (nats-server).

Each test runs once per backend through the parametrized ``store`` fixture. S3 stores
live under a fresh prefix of one session bucket; NATS stores in a fresh memory bucket
over a connection made in the test's own event loop.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from fleetserve.cluster import NatsServer
from fleetserve.storage import FileStore, MemoryStore, PayloadMissing, PayloadStore
from fleetserve.storage.nats import NatsObjectStore
from fleetserve.storage.s3 import S3Store

from .conftest import S3Server

BACKENDS = ["memory", "file", "s3", "nats"]
# how coarse each backend's last-modified time is, in seconds (0: finer than a millisecond)
MTIME_RESOLUTION = {"memory": 0.0, "file": 0.0, "s3": 1.0, "nats": 0.0}
BIG = os.urandom(3 << 20)
BAD_KEYS = ["", "/abs", "..", "a/../b", "a//b", "a/", ".hidden", "a/.x", "a b", "é", "a\\b"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[PayloadStore]:
    if backend == "nats":
        server: NatsServer = request.getfixturevalue("nats_server")
        nc = await nats.connect(server.url)
        bucket = f"t-{uuid.uuid4().hex}"
        try:
            nats_store = await NatsObjectStore.open(nc, bucket, storage="memory")
            yield nats_store
            await nats_store.close()
            await nats_store.close()  # idempotent
        finally:
            await nc.jetstream().delete_object_store(bucket)
            await nc.close()
        return
    made: PayloadStore
    if backend == "memory":
        made = MemoryStore()
    elif backend == "file":
        made = FileStore(tmp_path / "payloads")
    else:
        s3: S3Server = request.getfixturevalue("s3_server")
        made = S3Store(
            s3.bucket,
            prefix=f"t-{uuid.uuid4().hex}",
            endpoint=s3.endpoint,
            access_key_id=s3.access_key_id,
            secret_access_key=s3.secret_access_key,
        )
    yield made
    await made.close()
    await made.close()  # idempotent


def test_is_a_payload_store(store: PayloadStore, backend: str) -> None:
    assert isinstance(store, PayloadStore)
    assert store.url.startswith(f"{backend}://")
    assert "secret" not in store.url


@pytest.mark.parametrize(
    "data", [b"", b"x", bytes(range(256)), BIG], ids=["empty", "one", "all-bytes", "3MiB"]
)
async def test_round_trip(store: PayloadStore, data: bytes) -> None:
    await store.put("req/abc-in", data)
    got = await store.get("req/abc-in")
    assert type(got) is bytes
    assert got == data


async def test_get_missing_names_key_and_store(store: PayloadStore) -> None:
    with pytest.raises(PayloadMissing) as info:
        await store.get("req/nope-in")
    assert isinstance(info.value, LookupError)
    assert info.value.key == "req/nope-in"
    assert "req/nope-in" in str(info.value)
    assert store.url in str(info.value)


async def test_delete_is_idempotent(store: PayloadStore) -> None:
    await store.delete("req/never-in")
    await store.put("req/a-in", b"payload")
    await store.put("req/b-in", b"kept")
    await store.delete("req/a-in")
    with pytest.raises(PayloadMissing):
        await store.get("req/a-in")
    await store.delete("req/a-in")
    assert await store.get("req/b-in") == b"kept"


async def test_put_again_after_delete(store: PayloadStore) -> None:
    await store.put("req/a-in", b"first")
    await store.delete("req/a-in")
    await store.put("req/a-in", b"second")
    assert await store.get("req/a-in") == b"second"


async def test_overwrite(store: PayloadStore) -> None:
    await store.put("req/a-out", BIG)
    await store.put("req/a-out", b"small")
    assert await store.get("req/a-out") == b"small"
    await store.put("req/a-out", b"")
    assert await store.get("req/a-out") == b""


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_bad_keys_are_rejected(store: PayloadStore, key: str) -> None:
    with pytest.raises(ValueError):
        await store.put(key, b"x")
    with pytest.raises(ValueError):
        await store.get(key)
    with pytest.raises(ValueError):
        await store.delete(key)


async def test_keys_with_slashes_and_dots(store: PayloadStore) -> None:
    keys = ["req/3f2a-in", "a/b/c/d.e_f-g", "top", "v1.2/x"]
    for i, key in enumerate(keys):
        await store.put(key, f"payload {i}".encode())
    for i, key in enumerate(keys):
        assert await store.get(key) == f"payload {i}".encode()


async def test_sweep_with_large_max_age_deletes_nothing(store: PayloadStore) -> None:
    assert await store.sweep(3600) == 0
    await store.put("req/a-in", b"a")
    await store.put("req/b/c-out", b"c")
    assert await store.sweep(3600) == 0
    assert await store.get("req/a-in") == b"a"
    assert await store.get("req/b/c-out") == b"c"


async def test_sweep_with_zero_max_age_deletes_everything(store: PayloadStore) -> None:
    for i in range(3):
        await store.put(f"req/{i}-in", b"x")
    await asyncio.sleep(0.05)  # the point: every object is older than a max age of 0
    assert await store.sweep(0.0) == 3
    for i in range(3):
        with pytest.raises(PayloadMissing):
            await store.get(f"req/{i}-in")
    assert await store.sweep(0.0) == 0


async def test_sweep_deletes_only_old_objects(store: PayloadStore, backend: str) -> None:
    await store.put("req/old-in", b"old")
    cutoff = await _wait_past_cutoff(time.time(), MTIME_RESOLUTION[backend])
    await store.put("req/new-in", b"new")
    assert await store.sweep(time.time() - cutoff) == 1
    with pytest.raises(PayloadMissing):
        await store.get("req/old-in")
    assert await store.get("req/new-in") == b"new"


async def _wait_past_cutoff(written: float, resolution: float, margin: float = 0.1) -> float:
    """Sleep until anything written from now on looks newer than the returned cutoff
    to a store whose clock has ``resolution``, while what was written before
    ``written`` looks older. Stores that truncate to whole seconds need a new second."""
    if resolution:
        start = math.floor(written) + 1.0
        if start - written < margin:
            start += 1.0
    else:
        start = written + 1.5 * margin
    await asyncio.sleep(max(0.0, start - time.time()) + 0.01)
    return start - margin


async def test_sweep_rejects_negative_age(store: PayloadStore) -> None:
    with pytest.raises(ValueError):
        await store.sweep(-1)


async def test_concurrent_puts(store: PayloadStore) -> None:
    keys = [f"req/{i:02d}-in" for i in range(20)]
    await asyncio.gather(*(store.put(k, k.encode() * 1000) for k in keys))
    got = await asyncio.gather(*(store.get(k) for k in keys))
    assert got == [k.encode() * 1000 for k in keys]
