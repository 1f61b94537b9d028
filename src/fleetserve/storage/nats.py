"""NatsObjectStore: payloads in a JetStream Object Store bucket, next to the work queue.

The store borrows an already-connected ``nats.aio.client.Client``; ``close()`` leaves
the connection open for its owner. The bucket (stream ``OBJ_<bucket>``) is bound on
first use and created if missing, with file or memory storage and, when ``ttl`` is
given, a stream ``max_age`` so JetStream itself drops forgotten payloads.

Two departures from nats-py's ``ObjectStore``, both for a store whose objects live
for one request:

- ``get`` reads chunks with direct gets instead of an ordered push consumer, so
  no consumer is created per read, and an object deleted mid-read raises
  :class:`PayloadMissing` instead of waiting forever.
- ``delete`` purges the object's meta message as well as its chunks. nats-py leaves
  a tombstone per deleted object, which in a bucket without a TTL grows forever.

``sweep`` ages objects by their ``mtime``, which the writing client stamps.
"""

from __future__ import annotations

import base64
import re
from datetime import datetime
from hashlib import sha256
from typing import TYPE_CHECKING, Literal

from nats.js.api import ObjectInfo, ObjectStoreConfig, StorageType
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_DIGEST_TYPE,
    OBJ_META_PRE_TEMPLATE,
    OBJ_STREAM_TEMPLATE,
    VALID_BUCKET_RE,
    ObjectStore,
)

from .base import PayloadMissing, check_key, check_max_age, is_expired

if TYPE_CHECKING:
    from nats.aio.client import Client

_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_mtime(mtime: str | None) -> datetime | None:
    """An object's RFC 3339 ``mtime`` (nats-py writes microseconds, Go nanoseconds)."""
    if not mtime:
        return None
    try:
        return datetime.fromisoformat(_FRACTION.sub(r"\1", mtime))
    except ValueError:
        return None


def _digest(value: str | None) -> bytes | None:
    """The SHA-256 bytes of a ``SHA-256=<urlsafe base64>`` digest (either case prefix)."""
    if not value or value[: len(OBJ_DIGEST_TYPE)].upper() != OBJ_DIGEST_TYPE.upper():
        return None
    try:
        return base64.urlsafe_b64decode(value[len(OBJ_DIGEST_TYPE) :])
    except ValueError:
        return None


class NatsObjectStore:
    """Payloads in the JetStream Object Store bucket ``bucket``.

    ``storage`` and ``ttl`` (seconds) apply when this store creates the bucket; an
    existing bucket is used as it is. Use :meth:`open` to bind (and create) the bucket
    at once, so a bad server or bucket fails at start rather than on the first request.
    """

    def __init__(
        self,
        nc: Client,
        bucket: str,
        *,
        storage: Literal["file", "memory"] = "file",
        ttl: float | None = None,
        description: str = "fleetserve payloads",
    ) -> None:
        if VALID_BUCKET_RE.match(bucket) is None:
            raise ValueError(
                f"NATS object store bucket {bucket!r} must be letters, digits, '-' and '_'"
            )
        if storage not in ("file", "memory"):
            raise ValueError(f"NATS bucket storage must be 'file' or 'memory', not {storage!r}")
        if ttl is not None and ttl <= 0:
            raise ValueError(f"NATS bucket ttl must be > 0 seconds, got {ttl}")
        self.bucket = bucket
        self.storage = storage
        self.ttl = ttl
        self.description = description
        self._js = nc.jetstream()
        self._stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)
        self._obs: ObjectStore | None = None

    @classmethod
    async def open(
        cls,
        nc: Client,
        bucket: str,
        *,
        storage: Literal["file", "memory"] = "file",
        ttl: float | None = None,
    ) -> NatsObjectStore:
        """A store whose bucket is already bound, created if it did not exist."""
        store = cls(nc, bucket, storage=storage, ttl=ttl)
        await store._bound()
        return store

    @property
    def url(self) -> str:
        return f"nats://{self.bucket}"

    def __repr__(self) -> str:
        return f"NatsObjectStore({self.bucket!r}, storage={self.storage!r}, ttl={self.ttl})"

    async def _bound(self) -> ObjectStore:
        if self._obs is None:
            # Binding twice at once is harmless: creating an identical stream is a no-op.
            try:
                self._obs = await self._js.object_store(self.bucket)
            except BucketNotFoundError:
                config = ObjectStoreConfig(
                    description=self.description,
                    ttl=self.ttl,
                    storage=StorageType(self.storage),
                )
                try:
                    self._obs = await self._js.create_object_store(self.bucket, config)
                except BadRequestError:  # created meanwhile with another config
                    self._obs = await self._js.object_store(self.bucket)
        return self._obs

    async def put(self, key: str, data: bytes) -> None:
        obs = await self._bound()
        await obs.put(check_key(key), bytes(data))

    async def get(self, key: str) -> bytes:
        obs = await self._bound()
        check_key(key)
        for _ in range(3):  # an overwrite during the read purges the chunks being read
            try:
                info = await obs.get_info(key)
            except NotFoundError:
                break
            data = await self._read(info)
            if data is not None:
                return data
        raise PayloadMissing(key, self.url)

    async def _read(self, info: ObjectInfo) -> bytes | None:
        """The object's bytes, or None if its chunks went away while reading."""
        if not info.size:
            return b""
        subject = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=self.bucket, obj=info.nuid)
        parts: list[bytes] = []
        seq = 1
        for _ in range(info.chunks or 0):
            try:
                msg = await self._js.get_msg(
                    self._stream, seq=seq, subject=subject, direct=True, next=True
                )
            except NotFoundError:
                return None
            parts.append(msg.data or b"")
            seq = (msg.seq or seq) + 1
        data = b"".join(parts)
        if len(data) != info.size or _digest(info.digest) != sha256(data).digest():
            return None
        return data

    async def delete(self, key: str) -> None:
        check_key(key)
        await self._delete(await self._bound(), key)

    async def _delete(self, obs: ObjectStore, key: str) -> None:
        try:
            info = await obs.get_info(key)
        except NotFoundError:
            return
        meta = OBJ_META_PRE_TEMPLATE.format(
            bucket=self.bucket, obj=base64.urlsafe_b64encode(key.encode()).decode()
        )
        # meta first: from then on readers see the key as missing
        await self._js.purge_stream(self._stream, subject=meta)
        chunks = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=self.bucket, obj=info.nuid)
        await self._js.purge_stream(self._stream, subject=chunks)

    async def sweep(self, max_age: float) -> int:
        check_max_age(max_age)
        obs = await self._bound()
        try:
            infos = await obs.list(ignore_deletes=True)
        except NotFoundError:  # an empty bucket
            return 0
        deleted = 0
        for info in infos:
            mtime = parse_mtime(info.mtime)
            if mtime is not None and is_expired(mtime, max_age):
                await self._delete(obs, info.name)
                deleted += 1
        return deleted

    async def close(self) -> None:
        """Forgets the bucket; the connection belongs to the caller and stays open."""
        self._obs = None
