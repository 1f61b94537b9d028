"""The URL factory ``open_store``, the S3 and NATS options, and the offload helpers."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from pathlib import Path

import msgspec
import nats
import pytest

from fleetserve.cluster import NatsServer
from fleetserve.storage import (
    REF_HEADER,
    FileStore,
    MemoryStore,
    Offload,
    PayloadMissing,
    make_ref,
    new_key,
    open_store,
    parse_ref,
    sweep_forever,
)
from fleetserve.storage.nats import NatsObjectStore, parse_mtime
from fleetserve.storage.s3 import S3Store, redact_endpoint

from ..waiting import async_wait_for
from .conftest import S3Server


async def test_memory_url() -> None:
    store = await open_store("memory://")
    assert isinstance(store, MemoryStore)
    assert store.url == "memory://"


async def test_file_url_absolute(tmp_path: Path) -> None:
    store = await open_store(f"file://{tmp_path}/payloads")
    assert isinstance(store, FileStore)
    assert store.root == tmp_path / "payloads"
    assert store.root.is_dir()
    assert store.url == (tmp_path / "payloads").as_uri()


async def test_file_url_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = await open_store("file://./rel/dir")
    assert isinstance(store, FileStore)
    assert store.root == tmp_path / "rel" / "dir"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://host/x",
        "payloads",
        "file://otherhost/x",
        "memory://x",
        "memory://?a=1",
        "nats://bucket/extra",
        "s3://",
        "s3://bucket?nope=1",
        "s3://key:secret@bucket/p",
    ],
)
async def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        await open_store(url, nats=object())


async def test_unknown_scheme_lists_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="memory://, file://, s3://, nats://"):
        await open_store("gs://bucket")


async def test_nats_url_needs_a_client() -> None:
    with pytest.raises(ValueError, match="nats="):
        await open_store("nats://payloads")


async def test_nats_url_with_options(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    bucket = f"t-{uuid.uuid4().hex}"
    try:
        store = await open_store(f"nats://{bucket}?storage=memory&ttl=60", nats=nc)
        assert isinstance(store, NatsObjectStore)
        assert store.url == f"nats://{bucket}"
        info = await nc.jetstream().stream_info(f"OBJ_{bucket}")
        assert info.config.max_age == 60
        assert info.config.storage == "memory"
        await store.put("req/a-in", b"a")
        await store.close()
        assert not nc.is_closed  # the store does not own the connection
        again = await NatsObjectStore.open(nc, bucket)  # binds the existing bucket
        assert await again.get("req/a-in") == b"a"
        with pytest.raises(ValueError, match="storage"):
            await open_store(f"nats://{bucket}?storage=disk", nats=nc)
    finally:
        await nc.jetstream().delete_object_store(bucket)
        await nc.close()


def test_nats_bucket_name_is_checked() -> None:
    with pytest.raises(ValueError, match="bucket"):
        NatsObjectStore(object(), "no.dots")  # type: ignore[arg-type]


def test_nats_mtime_parsing() -> None:
    assert parse_mtime("2024-05-01T10:00:00.123456789Z") is not None
    assert parse_mtime("2024-05-01T10:00:00.123456+00:00") is not None
    assert parse_mtime("") is None
    assert parse_mtime("yesterday") is None


async def test_s3_url_with_endpoint_query(s3_server: S3Server) -> None:
    prefix = f"t-{uuid.uuid4().hex}/nested"
    url = f"s3://{s3_server.bucket}/{prefix}?endpoint={s3_server.endpoint}"
    store = await open_store(
        url,
        s3_access_key_id=s3_server.access_key_id,
        s3_secret_access_key=s3_server.secret_access_key,
    )
    assert isinstance(store, S3Store)
    assert store.prefix == prefix
    assert store.url == url
    assert s3_server.secret_access_key not in repr(store)
    await store.put("req/a-in", b"via url")
    assert await store.get("req/a-in") == b"via url"
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.get("req/a-in")


async def test_s3_ignores_aws_environment(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """obstore reads AWS_* itself; what the store pins must win over it."""
    for name, value in {
        "AWS_ENDPOINT_URL": "http://bad.invalid:1",
        "AWS_ENDPOINT": "http://bad.invalid:1",
        "AWS_REGION": "eu-nowhere-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true",
        "AWS_SKIP_SIGNATURE": "true",
        "AWS_ACCESS_KEY_ID": "from-env",
        "AWS_SECRET_ACCESS_KEY": "from-env",
        "AWS_SESSION_TOKEN": "from-env",
    }.items():
        monkeypatch.setenv(name, value)
    store = S3Store(
        s3_server.bucket,
        prefix=f"t-{uuid.uuid4().hex}",
        endpoint=s3_server.endpoint,
        access_key_id=s3_server.access_key_id,
        secret_access_key=s3_server.secret_access_key,
    )
    await store.put("req/env-in", b"pinned")
    assert await store.get("req/env-in") == b"pinned"
    await store.close()


def test_s3_options_are_checked() -> None:
    with pytest.raises(ValueError, match="both"):
        S3Store("bucket", access_key_id="only-the-id")
    with pytest.raises(ValueError, match="bucket"):
        S3Store("a/b")


def test_s3_url_hides_endpoint_credentials() -> None:
    assert redact_endpoint("http://user:pw@host:9000/x") == "http://host:9000/x"
    assert redact_endpoint("https://host") == "https://host"
    store = S3Store(
        "b", endpoint="http://user:pw@127.0.0.1:9", access_key_id="k", secret_access_key="s"
    )
    assert "pw" not in store.url


def test_s3_without_obstore_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)
    with pytest.raises(RuntimeError, match=r"fleetserve\[nats\]"):
        S3Store("bucket")


def test_new_key() -> None:
    assert new_key("3f2a9c", "in") == "req/3f2a9c-in"
    assert new_key("3f2a9c", "out") == "req/3f2a9c-out"
    # escaped, so ids that differ give keys that differ, and all are valid keys
    odd = ["a/b", "a_2Fb", "../x", "é", "a b", "a_b"]
    keys = {new_key(i, "in") for i in odd}
    assert len(keys) == len(odd)
    long = new_key("x" * 1000, "out")
    assert long.startswith("req/sha256-") and len(long) < 100
    with pytest.raises(ValueError):
        new_key("abc", "both")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        new_key("", "in")


def test_refs_are_never_bodies() -> None:
    ref = make_ref("req/abc-in")
    assert parse_ref(ref) == "req/abc-in"
    for body in [b"", b"{}", json.dumps({"input": "x"}).encode(), msgspec.msgpack.encode([1])]:
        assert parse_ref(body) is None
    with pytest.raises(ValueError):
        make_ref("../etc")


def test_ref_header_matches_the_wire() -> None:
    from fleetserve.wire import headers

    assert headers.PAYLOAD == REF_HEADER


async def test_offload_stash_load_discard() -> None:
    store = MemoryStore()
    off = Offload(store, threshold=10)
    assert await off.stash("r1", "in", b"0123456789") is None  # at the threshold: inline
    key = await off.stash("r1", "in", b"0123456789!")
    assert key == "req/r1-in"
    assert await off.load(key) == b"0123456789!"
    await off.stash("r1", "out", b"x" * 100)
    await off.discard("r1")
    assert len(store) == 0
    with pytest.raises(PayloadMissing):
        await off.load(key)
    assert Offload(store).threshold == 1 << 20
    with pytest.raises(ValueError):
        Offload(store, threshold=-1)


class FlakyStore(MemoryStore):
    """Fails every sweep and delete."""

    sweeps = 0

    async def sweep(self, max_age: float) -> int:
        self.sweeps += 1
        raise OSError("store down")

    async def delete(self, key: str) -> None:
        raise OSError("store down")


async def test_discard_logs_store_errors(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "fleetserve.storage"):
        await Offload(FlakyStore()).discard("r2")
    assert "req/r2-in" in caplog.text and "store down" in caplog.text


async def test_sweep_forever_sweeps_and_survives_errors(caplog: pytest.LogCaptureFixture) -> None:
    good = MemoryStore()
    await good.put("req/a-in", b"a")
    flaky = FlakyStore()
    with caplog.at_level(logging.INFO, "fleetserve.storage"):
        tasks = [
            asyncio.create_task(sweep_forever(good, max_age=0.0, every=0.01)),
            asyncio.create_task(sweep_forever(flaky, max_age=0.0, every=0.01)),
        ]
        await async_wait_for(
            lambda: len(good) == 0 and flaky.sweeps >= 2 and "deleted 1 objects" in caplog.text,
            5,
            "both sweepers to go round twice",
        )
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert len(good) == 0
    assert flaky.sweeps >= 2
    assert "deleted 1 objects" in caplog.text
    assert "store down" in caplog.text
    with pytest.raises(ValueError):
        await sweep_forever(good, max_age=1, every=0)
