"""The cold tier: adapters in an object store of their own, never swept.

The registry needs two things of a store that the payload stores' protocol lacks:
listing keys under a prefix, and *create-if-absent*, the atomic claim that makes two
uploads of one ``tenant/name@version`` through different gateways end in one winner
and one 409. :class:`AdapterStore` adds both over each payload store:

- memory: a dict check (one process);
- file: the bytes go to a temporary file that is hard-linked to the key
  (``link`` fails if the key exists, on every POSIX file system, NFS included;
  without hard links, an exclusive create);
- S3: a conditional put (``If-None-Match: *``);
- NATS: the object's meta message is published with
  ``Nats-Expected-Last-Subject-Sequence: 0``, which JetStream refuses when the key
  has a meta message already.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hashlib
import json
import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..settings import Settings
from ..storage import PayloadMissing, PayloadStore, check_key, open_store
from ..storage.outage import kind_of, unreachable

DISTRIBUTED_DEFAULT = "nats://fleetserve-adapters"
_WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed expected-sequence check


class AdapterStore:
    """A payload store plus ``keys(prefix)`` and ``create(key, data)``."""

    def __init__(self, store: PayloadStore, *, retry_after: float | None = None) -> None:
        self.store = store
        self._kind = _kind_of(store)
        self.retry_after = retry_after  # the setting: in the 503 of an outage

    @property
    def url(self) -> str:
        return self.store.url

    def __repr__(self) -> str:
        return f"AdapterStore({self.store!r})"

    def _guard(self) -> contextlib.AbstractContextManager[None]:
        return unreachable("adapter store", self._kind, self.url, self.retry_after)

    async def put(self, key: str, data: bytes) -> None:
        with self._guard():
            await self.store.put(key, data)

    async def put_file(self, key: str, path: Path) -> None:
        """Store the file at ``path`` under ``key`` without reading it into memory; the
        file is moved (a file store on the same file system: a rename) or left for the
        caller to delete. A file store's readers see the old bytes or the new, never
        part of a file; an object store gets a streamed (multipart) put."""
        check_key(key)
        if self._kind in ("memory", "other"):  # stores without a streamed put
            await self.put(key, await asyncio.to_thread(path.read_bytes))
            return
        with self._guard():
            if self._kind == "file":
                dest = self.store.root / key  # type: ignore[attr-defined]
                await asyncio.to_thread(_file_move, path, dest)
            elif self._kind == "s3":
                import obstore

                await obstore.put_async(self.store.objects, key, path)  # type: ignore[attr-defined]
            else:  # nats
                obs = await self.store._bound()  # type: ignore[attr-defined]
                f = await asyncio.to_thread(open, path, "rb")
                try:
                    await obs.put(key, f)
                finally:
                    f.close()

    async def get(self, key: str) -> bytes:
        with self._guard():
            return await self.store.get(key)

    async def delete(self, key: str) -> None:
        with self._guard():
            await self.store.delete(key)

    async def close(self) -> None:
        await self.store.close()

    async def keys(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""
        found: list[str]
        with self._guard():
            if self._kind == "memory":
                found = list(self.store._objects)  # type: ignore[attr-defined]
            elif self._kind == "file":
                found = await asyncio.to_thread(_file_keys, self.store.root)  # type: ignore[attr-defined]
            elif self._kind == "s3":
                found = await _s3_keys(self.store, prefix)
            elif self._kind == "nats":
                found = await _nats_keys(self.store)
            else:
                found = list(await self.store.keys(prefix))  # type: ignore[attr-defined]
        return sorted(k for k in found if k.startswith(prefix))

    async def create(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` unless something is there: True if this call
        created it, False if the key existed (atomically, across processes)."""
        check_key(key)
        if self._kind == "memory":
            objects: dict[str, object] = self.store._objects  # type: ignore[attr-defined]
            if key in objects:
                return False
            await self.store.put(key, data)
            return True
        with self._guard():
            if self._kind == "file":
                path = self.store.root / key  # type: ignore[attr-defined]
                return await asyncio.to_thread(_file_create, path, data)
            if self._kind == "s3":
                return await _s3_create(self.store, key, data)
            if self._kind == "nats":
                return await _nats_create(self.store, key, data)
            return bool(await self.store.create(key, data))  # type: ignore[attr-defined]


def _kind_of(store: PayloadStore) -> str:
    """The store's kind (``storage.outage.kind_of``); another kind must list its keys
    and create one atomically itself."""
    kind = kind_of(store)
    if kind == "other" and not (hasattr(store, "keys") and hasattr(store, "create")):
        raise TypeError(f"{store!r} cannot hold adapters: it lists no keys and has no create")
    return kind


def _file_keys(root: Path) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for name in files:
            if not name.startswith("."):  # a writer's temporary file
                out.append((rel / name).as_posix())
    return out


def _file_create(path: Path, data: bytes) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: exclusive create, then write
        return _exclusive_create(path, data)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _file_move(src: Path, dest: Path) -> None:
    """``src`` renamed to ``dest`` (atomically); across file systems, copied to a
    temporary file beside ``dest`` first, then renamed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dest)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _exclusive_create(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True


async def _s3_keys(store: Any, prefix: str) -> list[str]:
    import obstore

    out: list[str] = []
    async for batch in obstore.list(store.objects, prefix=prefix or None, chunk_size=1000):
        out.extend(str(m["path"]) for m in batch)
    return out


async def _s3_create(store: Any, key: str, data: bytes) -> bool:
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    try:
        await obstore.put_async(store.objects, key, data, mode="create")
    except (AlreadyExistsError, PreconditionError):
        return False
    return True


async def _nats_keys(store: Any) -> list[str]:
    from nats.js.errors import NotFoundError

    obs = await store._bound()
    try:
        infos = await obs.list(ignore_deletes=True)
    except NotFoundError:  # an empty bucket
        return []
    return [str(i.name) for i in infos]


async def _nats_create(store: Any, key: str, data: bytes) -> bool:
    """One chunk, then the meta message only if the key has none (JetStream checks)."""
    from nats.js.errors import APIError
    from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_META_PRE_TEMPLATE

    await store._bound()
    js, bucket = store._js, store.bucket
    nuid = uuid.uuid4().hex
    chunks = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket, obj=nuid)
    if data:
        await js.publish(chunks, data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
    info = {
        "name": key,
        "bucket": bucket,
        "nuid": nuid,
        "size": len(data),
        "chunks": 1 if data else 0,
        "mtime": datetime.now(UTC).isoformat(),
        "digest": f"SHA-256={digest}",
    }
    meta = OBJ_META_PRE_TEMPLATE.format(
        bucket=bucket, obj=base64.urlsafe_b64encode(key.encode()).decode()
    )
    try:
        await js.publish(
            meta,
            json.dumps(info).encode(),
            headers={"Nats-Expected-Last-Subject-Sequence": "0"},
        )
    except APIError as exc:
        with contextlib.suppress(Exception):
            await js.purge_stream(store._stream, subject=chunks)
        if exc.err_code == _WRONG_LAST_SEQUENCE:
            return False
        raise
    return True


def _embedded_default(cache_dir: str) -> str:
    return (Path(cache_dir).expanduser().absolute() / "adapter-store").as_uri()


async def open_adapter_store(settings: Settings, *, nats: object = None) -> AdapterStore:
    """The adapter store Settings name: ``adapter_store``, else ``nats://fleetserve-
    adapters`` given a NATS connection (distributed mode), else a directory under
    ``cache_dir``. It must not be the payload store, whose sweeper deletes old objects."""
    url = settings.adapter_store
    if not url:
        url = DISTRIBUTED_DEFAULT if nats is not None else _embedded_default(settings.cache_dir)
    if settings.payload_store and url.rstrip("/") == settings.payload_store.rstrip("/"):
        raise ValueError(
            f"adapter_store {url!r} is the payload store; give adapters their own "
            "(the payload sweeper deletes what is older than payload_ttl)"
        )
    if url.startswith("nats://") and "ttl=" in url:
        raise ValueError(f"adapter_store {url!r}: adapters must not expire; drop ttl")
    store = await open_store(
        url,
        nats=nats,
        s3_access_key_id=settings.s3_access_key_id or None,
        s3_secret_access_key=settings.s3_secret_access_key or None,
        s3_region=settings.s3_region or None,
        s3_endpoint=settings.s3_endpoint or None,
    )
    return AdapterStore(store, retry_after=settings.retry_after)


__all__ = ["DISTRIBUTED_DEFAULT", "AdapterStore", "PayloadMissing", "open_adapter_store"]
