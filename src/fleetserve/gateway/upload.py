"""Uploads received straight to disk, and how many may arrive at once.

An upload (``/v1/adapters``, ``/v1/files``) is never held whole in memory: each file
goes to a :class:`Spool`, a temporary file under ``<cache_dir>/uploads`` that is
hashed (sha256) and checked against its size limit as the bytes arrive, in writes of
up to :data:`FLUSH` bytes made off the event loop. What reads it afterwards (the
validation, the store) reads the file; a refused or cut-off upload's file is deleted.

:class:`Uploads` bounds how many uploads a gateway receives at once: per tenant
(``max_uploads_per_tenant``, beyond it a 429) and overall (``max_uploads``, a 503),
both with Retry-After, before a byte of the body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ..settings import Settings
from ..wire import Overloaded, PayloadTooLarge, Unavailable

FLUSH = 1 << 20  # bytes gathered before one write to the spool file
PREFIX, SUFFIX = ".upload-", ".tmp"
STALE = 3600.0  # seconds after which a spool file left by a crash is removed


class Spool:
    """One uploaded file's bytes in a temporary file under ``root``, hashed on the way;
    413 (naming ``what`` and the ``setting``) as soon as it passes ``limit`` bytes."""

    def __init__(self, root: Path, limit: int, *, what: str, field: str, setting: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=PREFIX, suffix=SUFFIX, dir=root)
        self.path = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._pending = bytearray()
        self.size = 0
        self.limit, self.what, self.field, self.setting = limit, what, field, setting

    async def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise PayloadTooLarge(
                f"{self.what} is over this server's limit of {self.limit} bytes ({self.setting})",
                field=self.field,
            )
        self._pending += data
        if len(self._pending) >= FLUSH:
            await self._flush()

    async def _flush(self) -> None:
        if self._pending:
            data, self._pending = bytes(self._pending), bytearray()
            await asyncio.to_thread(self._write, data)

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._hash.update(data)

    async def finish(self) -> Spool:
        """Every byte written and the file closed; returns this spool."""
        await self._flush()
        self._file.close()
        return self

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def discard(self) -> None:
        """Close and delete the file (it may have been moved into a store already)."""
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


class Uploads:
    """Where uploads spool (``root``) and how many may arrive at once."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        total: int = 8,
        per_tenant: int = 2,
        retry_after: float = 1.0,
    ) -> None:
        base = Path(root).expanduser() if root is not None else Path(tempfile.gettempdir())
        self.root = base.absolute()
        self.total, self.per_tenant, self.retry_after = total, per_tenant, retry_after
        self.active = 0
        self._by_tenant: dict[str, int] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Uploads:
        uploads = cls(
            Path(settings.cache_dir).expanduser() / "uploads",
            total=int(settings.max_uploads),
            per_tenant=int(settings.max_uploads_per_tenant),
            retry_after=float(settings.retry_after),
        )
        uploads.sweep()
        return uploads

    def spool(self, limit: int, *, what: str, field: str, setting: str) -> Spool:
        return Spool(self.root, limit, what=what, field=field, setting=setting)

    @contextlib.contextmanager
    def slot(self, tenant: str) -> Iterator[None]:
        """Hold one of the upload slots while receiving; 429 or 503 when none is free."""
        held = self._by_tenant.get(tenant, 0)
        if held >= self.per_tenant:
            raise Overloaded(
                f"tenant {tenant} is sending {held} uploads at once, the limit "
                f"(max_uploads_per_tenant); retry when one is done",
                field="body",
                retry_after=self.retry_after,
            )
        if self.active >= self.total:
            raise Unavailable(
                f"this server is receiving {self.active} uploads, the limit (max_uploads); "
                "retry shortly",
                field="body",
                retry_after=self.retry_after,
            )
        self.active += 1
        self._by_tenant[tenant] = held + 1
        try:
            yield
        finally:
            self.active -= 1
            left = self._by_tenant[tenant] - 1
            if left:
                self._by_tenant[tenant] = left
            else:
                del self._by_tenant[tenant]

    def sweep(self, max_age: float = STALE) -> int:
        """Delete spool files a crashed process left, once ``max_age`` seconds old."""
        if not self.root.is_dir():
            return 0
        gone, now = 0, time.time()
        for path in self.root.glob(f"{PREFIX}*{SUFFIX}"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > max_age:
                    path.unlink()
                    gone += 1
        return gone
