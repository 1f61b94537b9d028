"""FileStore: payloads as files under one directory, e.g. a volume shared by one host.

``req/3f2a-in`` is stored at ``<root>/req/3f2a-in``. A write goes to a temporary file
in the same directory (``.<name>.<random>.tmp``, a name no valid key can have) and is
then renamed over the target with :func:`os.replace`, so readers see the old bytes or
the new bytes, never half a file. Files are not fsync-ed: payloads live for one
request, and a crash loses the request anyway. Blocking calls run in
:func:`asyncio.to_thread`.

Directories made for keys are kept (sweeping them would race with writers); with
``req/...`` keys there is just one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path

from .base import PayloadMissing, check_key, check_max_age, is_expired

TMP_SUFFIX = ".tmp"


class FileStore:
    """Payloads as files under ``root`` (created if missing)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, self._path(key), data)

    async def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise PayloadMissing(key, self.url) from None

    async def delete(self, key: str) -> None:
        path = self._path(key)
        # a directory under a key is not a payload, and a file on the path is not one either
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            await asyncio.to_thread(path.unlink)

    async def sweep(self, max_age: float) -> int:
        """Delete payloads older than ``max_age``, and temporary files a crashed
        writer left that are as old; only payloads are counted."""
        check_max_age(max_age)
        return await asyncio.to_thread(self._sweep, max_age)

    async def close(self) -> None:
        """Nothing to release; the files stay for other processes."""

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TMP_SUFFIX}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    def _sweep(self, max_age: float) -> int:
        now = time.time()
        deleted = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    mtime = os.stat(path).st_mtime
                except FileNotFoundError:  # deleted since the listing
                    continue
                if not is_expired(mtime, max_age, now):
                    continue
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
                    deleted += 1
        return deleted
