"""The registry's contract on every store (memory, file, NATS object store): versions,
tenants, 409s, limits, and nothing left behind by a failure."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest

from fleetserve.cluster import NatsServer
from fleetserve.lora.registry import AdapterRegistry
from fleetserve.lora.store import DISTRIBUTED_DEFAULT, AdapterStore, open_adapter_store
from fleetserve.settings import Settings
from fleetserve.wire import AdapterId, AdapterNotFound, Conflict, Forbidden, InvalidInput

from .kit import ADMIN, ALICE, BASE, BOB, READER, Kit, kit_fixture, registry_on, store_fixture  # noqa: F401


def reg(store: AdapterStore, kit: Kit, **limits: int) -> AdapterRegistry:
    return registry_on(store, kit, **limits)


async def test_the_store_claims_a_key_once(store: AdapterStore) -> None:
    assert await store.create("adapters/t/n/1/claim", b"one")
    assert not await store.create("adapters/t/n/1/claim", b"two")
    assert await store.get("adapters/t/n/1/claim") == b"one"
    await store.put("adapters/t/n/1/info.json", b"{}")
    assert await store.keys("adapters/t/") == ["adapters/t/n/1/claim", "adapters/t/n/1/info.json"]
    assert await store.keys("adapters/u/") == []
    await store.delete("adapters/t/n/1/claim")
    assert await store.create("adapters/t/n/1/claim", b"three")
    results = await asyncio.gather(*(store.create("adapters/t/n/2/claim", b"x") for _ in range(4)))
    assert sorted(results) == [False, False, False, True]


async def test_create_get_list_delete_and_versions(store: AdapterStore, kit: Kit) -> None:
    r = reg(store, kit)
    one = await r.create(ALICE, "legal", kit.lora.config, kit.lora.weights, base=BASE)
    assert str(one.id) == "alice/legal@1" and one.base == BASE and one.rank == 4
    assert one.sha256 == one.manifest.sha256 and len(one.sha256) == 64
    two = await r.create(ALICE, "alice/legal", kit.lora2.config, kit.lora2.weights)
    assert str(two.id) == "alice/legal@2" and two.rank == 8  # base from the config
    assert (await r.get(ALICE, "alice/legal")).id == two.id  # newest
    assert (await r.get(ALICE, "legal@1")).sha256 == one.sha256  # a bare name: own tenant
    five = await r.create(ALICE, "legal", kit.lora.config, kit.lora.weights, version=5)
    assert (await r.get(READER, "alice/legal")).id == five.id
    with pytest.raises(Conflict, match="alice/legal@2 exists already"):
        await r.create(ALICE, "legal", kit.lora.config, kit.lora.weights, version=2)
    assert [str(i.id) for i in await r.list(ALICE)] == [
        "alice/legal@1",
        "alice/legal@2",
        "alice/legal@5",
    ]
    assert await r.list(ALICE, base="tiny/other-bert") == []
    assert await r.files("alice/legal@2") == (kit.lora2.config, kit.lora2.weights)
    assert await r.count("alice") == 3
    assert [str(g) for g in await r.delete(ALICE, "alice/legal@2")] == ["alice/legal@2"]
    with pytest.raises(AdapterNotFound, match="alice/legal@2"):
        await r.get(ALICE, "alice/legal@2")
    with pytest.raises(AdapterNotFound, match="did you mean 'alice/legal'"):
        await r.get(ALICE, "alice/lega")  # a typo: the tenant's close names
    with pytest.raises(AdapterNotFound):
        await r.files("alice/legal@2")
    assert not r.deleted.isdisjoint({"alice/legal@2"})
    gone = await r.delete(ALICE, "alice/legal")  # every version
    assert [str(g) for g in gone] == ["alice/legal@1", "alice/legal@5"]
    with pytest.raises(AdapterNotFound, match="no adapter alice/legal"):
        await r.get(ALICE, "alice/legal")
    with pytest.raises(AdapterNotFound):
        await r.delete(ALICE, "alice/legal")
    # only each deleted version's claim and tombstone stay: a number is never reused
    assert {k.rsplit("/", 1)[1] for k in await store.keys()} == {"claim", "deleted"}
    again = await r.create(ALICE, "legal", kit.lora.config, kit.lora.weights, base=BASE)
    assert str(again.id) == "alice/legal@6"
    with pytest.raises(Conflict, match="never reused"):
        await r.create(ALICE, "legal", kit.lora.config, kit.lora.weights, version=2)


async def test_tenants_see_their_own_and_public_adapters(store: AdapterStore, kit: Kit) -> None:
    r = reg(store, kit)
    await r.create(ALICE, "mine", kit.lora.config, kit.lora.weights)
    await r.create(ADMIN, "public/shared", kit.lora.config, kit.lora.weights)
    for caller in (BOB,):
        with pytest.raises(AdapterNotFound, match="no adapter alice/mine"):
            await r.get(caller, "alice/mine")
        with pytest.raises(AdapterNotFound, match="alice/mine"):
            await r.delete(caller, "alice/mine")
    assert [str(i.id) for i in await r.list(BOB)] == ["public/shared@1"]
    assert [str(i.id) for i in await r.list(ALICE)] == ["alice/mine@1", "public/shared@1"]
    assert len(await r.list(ADMIN)) == 2
    assert (await r.get(BOB, "public/shared")).id.tenant == "public"
    with pytest.raises(Forbidden, match="admin"):
        await r.create(ALICE, "public/mine", kit.lora.config, kit.lora.weights)
    with pytest.raises(Forbidden, match="tenant bob"):
        await r.create(ALICE, "bob/x", kit.lora.config, kit.lora.weights)
    with pytest.raises(Forbidden, match="adapters:write"):
        await r.create(READER, "x", kit.lora.config, kit.lora.weights)
    with pytest.raises(Forbidden):
        await r.delete(ALICE, "public/shared")  # visible, but not hers to delete
    with pytest.raises(Forbidden):
        await r.delete(READER, "alice/mine")
    await r.delete(ADMIN, "alice/mine")
    live = [k for k in await store.keys() if not k.endswith(("/claim", "/deleted"))]
    assert [k.split("/")[1] for k in live] == ["public"] * 3  # alice's: a tombstone


async def test_two_uploads_at_once_one_wins_one_409(store: AdapterStore, kit: Kit) -> None:
    r = reg(store, kit)
    results = await asyncio.gather(
        r.create(ALICE, "race", kit.lora.config, kit.lora.weights),
        r.create(ALICE, "race", kit.lora2.config, kit.lora2.weights),
        return_exceptions=True,
    )
    wins = [x for x in results if not isinstance(x, BaseException)]
    losses = [x for x in results if isinstance(x, BaseException)]
    assert len(wins) == 1 and len(losses) == 1
    assert isinstance(losses[0], Conflict) and "alice/race" in losses[0].message
    assert await r.count("alice") == 1


async def test_two_gateways_racing_for_one_version(store: AdapterStore, kit: Kit) -> None:
    a, b = reg(store, kit), reg(store, kit)  # two processes over one store
    results = await asyncio.gather(
        a.create(ALICE, "race", kit.lora.config, kit.lora.weights, version=1),
        b.create(ALICE, "race", kit.lora2.config, kit.lora2.weights, version=1),
        return_exceptions=True,
    )
    assert sorted(type(x).__name__ for x in results) == ["AdapterRecord", "Conflict"]
    assert len([k for k in await store.keys() if k.endswith("info.json")]) == 1


async def test_an_upload_in_flight_elsewhere_is_a_409(store: AdapterStore, kit: Kit) -> None:
    claim = json.dumps({"created": 0}).encode()
    assert await store.create("adapters/alice/busy/1/claim", claim)  # another gateway
    r = reg(store, kit)
    with pytest.raises(Conflict, match="alice/busy@1 is being uploaded"):
        await r.create(ALICE, "busy", kit.lora.config, kit.lora.weights, version=1)
    nxt = await r.create(ALICE, "busy", kit.lora.config, kit.lora.weights)
    assert nxt.id.version == 2  # the next free version
    with pytest.raises(AdapterNotFound):
        await r.get(ALICE, "busy@1")  # uncommitted: invisible
    assert await r.sweep_uncommitted(max_age=60) == 1  # its claim is from 1970
    assert await store.keys("adapters/alice/busy/1/") == []


async def test_the_count_limit_per_tenant(store: AdapterStore, kit: Kit) -> None:
    r = reg(store, kit, max_per_tenant=2)
    await r.create(ALICE, "a", kit.lora.config, kit.lora.weights)
    await r.create(ALICE, "a", kit.lora.config, kit.lora.weights)
    before = await store.keys()
    with pytest.raises(InvalidInput, match="tenant alice holds 2 adapters") as info:
        await r.create(ALICE, "b", kit.lora.config, kit.lora.weights)
    assert "max_adapters_per_tenant" in info.value.message
    assert await store.keys() == before
    await r.create(BOB, "b", kit.lora.config, kit.lora.weights)  # another tenant's count


class _Failing:
    """A store whose put of the weights fails once (a crash of the disk, the network)."""

    def __init__(self, inner: AdapterStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def put(self, key: str, data: bytes) -> None:
        if key.endswith("adapter_model.safetensors"):
            raise OSError("disk gone")
        await self.inner.put(key, data)


async def test_a_failed_write_leaves_nothing(store: AdapterStore, kit: Kit) -> None:
    r = reg(store, kit)
    r.store = _Failing(store)  # type: ignore[assignment]
    with pytest.raises(OSError, match="disk gone"):
        await r.create(ALICE, "x", kit.lora.config, kit.lora.weights)
    assert await store.keys() == []
    r.store = store
    assert (await r.create(ALICE, "x", kit.lora.config, kit.lora.weights)).id.version == 1


async def test_other_gateways_uploads_and_deletes_are_seen(store: AdapterStore, kit: Kit) -> None:
    now = [1000.0]
    a = reg(store, kit)
    b = AdapterRegistry(store, limits=a.limits, bases=kit.bases(), ttl=5.0, clock=lambda: now[0])
    with pytest.raises(AdapterNotFound):
        await b.get(ALICE, "alice/x")
    await a.create(ALICE, "x", kit.lora.config, kit.lora.weights)
    assert (await b.get(ALICE, "alice/x")).id.version == 1  # a miss re-reads the store
    await a.create(ALICE, "x", kit.lora2.config, kit.lora2.weights)
    assert (await b.get(ALICE, "alice/x@2")).rank == 8
    now[0] += 6  # past the ttl of b's listing
    assert (await b.get(ALICE, "alice/x")).id == AdapterId("alice", "x", 2)
    assert len(await b.list(ALICE)) == 2
    await a.delete(ALICE, "alice/x@1")
    with pytest.raises(AdapterNotFound):
        await b.files("alice/x@1")  # b had its info cached; the files are gone
    assert [str(i.id) for i in await b.list(ALICE)] == ["alice/x@2"]


async def test_the_adapter_store_settings_name(tmp_path: Path, nats_server: NatsServer) -> None:
    embedded = await open_adapter_store(Settings.load(overrides={"cache_dir": str(tmp_path)}))
    assert embedded.url == (tmp_path / "adapter-store").as_uri()
    nc = await nats.connect(nats_server.url)
    try:
        distributed = await open_adapter_store(Settings.load(), nats=nc)
        assert distributed.url == DISTRIBUTED_DEFAULT == "nats://fleetserve-adapters"
        assert await distributed.create("adapters/t/n/1/claim", b"x")
        assert await distributed.keys("adapters/t/") == ["adapters/t/n/1/claim"]
        await distributed.delete("adapters/t/n/1/claim")
    finally:
        await nc.close()
    same = {"adapter_store": "memory://", "payload_store": "memory://"}
    with pytest.raises(ValueError, match="is the payload store"):
        await open_adapter_store(Settings.load(overrides=same))
    with pytest.raises(ValueError, match="must not expire"):
        await open_adapter_store(Settings.load(overrides={"adapter_store": "nats://a?ttl=5"}))
