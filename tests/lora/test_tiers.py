"""The warm tier: fetched once (coalesced), verified, renamed into place, least recently
used out, never one held or pinned."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from fleetserve.lora.registry import AdapterRegistry
from fleetserve.lora.store import AdapterStore
from fleetserve.lora.tiers import AdapterCache
from fleetserve.lora.validate import CONFIG, WEIGHTS
from fleetserve.storage import MemoryStore
from fleetserve.wire import AdapterNotFound, InternalError

from .kit import ADMIN, ALICE, Kit, kit_fixture, registry_on  # noqa: F401


@pytest.fixture
async def reg(kit: Kit) -> AdapterRegistry:
    r = registry_on(AdapterStore(MemoryStore()), kit)
    for name in ("a", "b", "c"):
        await r.create(ALICE, name, kit.lora.config, kit.lora.weights)
    return r


def size(kit: Kit) -> int:
    return len(kit.lora.config) + len(kit.lora.weights)


async def test_fetched_once_and_coalesced(reg: AdapterRegistry, kit: Kit, tmp_path: Path) -> None:
    cache = AdapterCache(reg, tmp_path / "warm", 10 * size(kit))
    paths = await asyncio.gather(*(cache.local("alice/a@1") for _ in range(5)))
    assert len(set(paths)) == 1 and cache.fetches == 1
    path = paths[0]
    assert (path / CONFIG).read_bytes() == kit.lora.config
    assert (path / WEIGHTS).read_bytes() == kit.lora.weights
    assert path.parent == tmp_path / "warm" / "alice" / "a"
    assert await cache.local("alice/a") == path  # newest: the same version
    assert cache.fetches == 1 and cache.nbytes == size(kit)
    assert not list((tmp_path / "warm").glob(".tmp-*"))


async def test_least_recently_used_leave_first(
    reg: AdapterRegistry,
    kit: Kit,
    tmp_path: Path,
) -> None:
    cache = AdapterCache(reg, tmp_path / "warm", 2 * size(kit))
    a = await cache.local("alice/a@1")
    b = await cache.local("alice/b@1")
    await cache.local("alice/a@1")  # a is used again: b is now the oldest
    c = await cache.local("alice/c@1")
    assert a.is_dir() and c.is_dir() and not b.exists()
    assert cache.nbytes == 2 * size(kit)
    await cache.local("alice/b@1")
    assert cache.fetches == 4 and not a.exists()


async def test_held_and_pinned_adapters_stay(
    reg: AdapterRegistry, kit: Kit, tmp_path: Path
) -> None:
    await reg.create(ADMIN, "public/pinned", kit.lora.config, kit.lora.weights, pinned=True)
    cache = AdapterCache(reg, tmp_path / "warm", size(kit))
    pinned = await cache.local("public/pinned@1")
    async with cache.hold("alice/a@1") as held:
        await cache.local("alice/b@1")
        await cache.local("alice/c@1")
        assert held.is_dir() and pinned.is_dir()
        assert (held / WEIGHTS).read_bytes() == kit.lora.weights
    c = await cache.local("alice/c@1")  # a is no longer held: it may go now
    assert c.is_dir() and not held.exists() and pinned.is_dir()


async def test_a_corrupt_copy_is_refused(reg: AdapterRegistry, kit: Kit, tmp_path: Path) -> None:
    await reg.store.put("adapters/alice/a/1/adapter_model.safetensors", kit.lora2.weights)
    cache = AdapterCache(reg, tmp_path / "warm", 10 * size(kit))
    with pytest.raises(
        InternalError, match=re.escape("alice/a@1: the stored adapter_model.safetensors")
    ):
        await cache.local("alice/a@1")
    assert not (tmp_path / "warm" / "alice").exists() or not any(
        (tmp_path / "warm" / "alice").rglob("*.safetensors")
    )


async def test_deleted_adapters_are_not_found_and_not_alive(
    reg: AdapterRegistry,
    kit: Kit,
    tmp_path: Path,
) -> None:
    cache = AdapterCache(reg, tmp_path / "warm", 10 * size(kit))
    path = await cache.local("alice/a@1")
    assert cache.alive("alice/a@1")
    await reg.delete(ALICE, "alice/a")
    assert not cache.alive("alice/a@1")
    assert cache.forget("alice/a") == 1 and not path.exists()
    with pytest.raises(AdapterNotFound, match="alice/a@1"):
        await cache.local("alice/a@1")
    other = AdapterCache(reg, tmp_path / "warm2", 10 * size(kit))
    reg.deleted.clear()  # as another process would, which did not see the delete
    with pytest.raises(AdapterNotFound):
        await other.local("alice/a@1")
    assert not other.alive("alice/a@1")


async def test_a_new_cache_adopts_what_is_on_disk(
    reg: AdapterRegistry,
    kit: Kit,
    tmp_path: Path,
) -> None:
    first = AdapterCache(reg, tmp_path / "warm", 10 * size(kit))
    path = await first.local("alice/a@1")
    (tmp_path / "warm" / ".tmp-leftover").mkdir()
    again = AdapterCache(reg, tmp_path / "warm", 10 * size(kit))
    assert await again.local("alice/a@1") == path
    assert again.fetches == 0 and again.nbytes == size(kit)
    assert not (tmp_path / "warm" / ".tmp-leftover").exists()


async def test_a_name_uploaded_again_after_a_delete_gets_fresh_bytes(
    reg: AdapterRegistry,
    kit: Kit,
    tmp_path: Path,
) -> None:
    cache = AdapterCache(reg, tmp_path / "warm", 10 * size(kit))
    old = await cache.local("alice/a@1")
    await reg.delete(ALICE, "alice/a")
    info = await reg.create(ALICE, "a", kit.lora2.config, kit.lora2.weights)
    assert str(info.id) == "alice/a@2"  # a deleted version's number is never reused
    with pytest.raises(AdapterNotFound):
        await cache.local("alice/a@1")
    new = await cache.local("alice/a")
    assert new != old and (new / WEIGHTS).read_bytes() == kit.lora2.weights
