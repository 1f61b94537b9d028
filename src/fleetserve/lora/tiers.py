"""The warm tier: adapters on local disk, filled from the cold tier (the object store).

``await cache.local(id)`` is a directory holding ``adapter_config.json`` and
``adapter_model.safetensors``. The first call fetches both from the registry's store,
checks them against their sha256, writes them to a temporary directory and renames it
into place, so a reader never sees half an adapter; concurrent calls for one adapter
share that one fetch. Directories are named by version *and* content hash
(``<dir>/<tenant>/<name>/<version>-<sha256[:16]>``), so a version number reused after
a delete never serves the old bytes.

The tier holds at most ``max_bytes``: after each fetch the least recently used
adapters leave, never one being fetched or held (:meth:`AdapterCache.hold`), nor a
pinned one. What a previous run left on disk is reused. One directory serves one
process: processes sharing one would evict each other's files.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from ..settings import Settings
from ..wire import AdapterId, AdapterNotFound, InternalError, parse_adapter_id
from .manifest import AdapterRecord
from .registry import AdapterRegistry
from .validate import CONFIG, WEIGHTS


@dataclass(slots=True)
class _Entry:
    path: Path
    nbytes: int
    used: float
    pinned: bool = False


def _slot(info: AdapterRecord) -> str:
    return f"{info.id.tenant}/{info.id.name}/{info.version}-{info.sha256[:16]}"


class AdapterCache:
    """Adapters on local disk under ``dir``, within ``max_bytes``."""

    def __init__(
        self,
        registry: AdapterRegistry,
        dir: str | Path,
        max_bytes: int,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.dir = Path(dir).expanduser()
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._fetching: dict[str, asyncio.Task[Path]] = {}
        self._held: Counter[str] = Counter()
        self._dead: set[str] = set()  # id@version strings found deleted
        self.fetches = 0  # fetches from the cold tier (for tests and metrics)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._scan()

    @classmethod
    def from_settings(
        cls, registry: AdapterRegistry, settings: Settings, node: str = ""
    ) -> AdapterCache:
        """``<cache_dir>/adapters[/<node>]`` within ``adapter_cache_bytes`` (a size or a
        percent of that file system). Processes sharing a cache directory (workers of
        one host) each pass their own ``node``: one directory serves one process."""
        from ..fleet.memory import parse_size

        root = Path(settings.cache_dir).expanduser() / "adapters"
        if node:
            root = root / node
        root.mkdir(parents=True, exist_ok=True)
        try:
            cap = parse_size(settings.adapter_cache_bytes, limit=shutil.disk_usage(root).total)
        except ValueError:
            raise ValueError(
                f"adapter_cache_bytes: cannot use {settings.adapter_cache_bytes!r}; give a "
                "size such as 2GiB or a percent of the disk"
            ) from None
        return cls(registry, root, cap)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def alive(self, key: str) -> bool:
        """False once ``key`` (``tenant/name@version``) is known to be deleted; no I/O."""
        return key not in self._dead and key not in self.registry.deleted

    async def check(self, key: str) -> None:
        """``AdapterNotFound`` if version ``key`` was deleted, through any gateway (seen
        within the registry's ``ttl``); then ``alive`` says so too, without I/O."""
        aid = parse_adapter_id(key)
        if aid.version is not None and (
            not self.alive(key) or not await self.registry.committed(aid)
        ):
            self._dead.add(key)
            raise AdapterNotFound(f"adapter {key!r} was deleted", field="adapter")

    def pinned(self, key: str) -> bool:
        """Whether ``key`` was uploaded pinned (it then never leaves the hot tier)."""
        info = self.registry.cached(parse_adapter_id(key))
        return info is not None and info.pinned

    async def local(self, adapter: str | AdapterId) -> Path:
        """The adapter's directory on this disk, fetched once (newest version if the id
        has none); ``AdapterNotFound`` if it is not, or no longer, in the store."""
        return (await self._local(adapter))[1]

    @contextlib.asynccontextmanager
    async def hold(self, adapter: str | AdapterId) -> AsyncIterator[Path]:
        """The adapter's directory, kept from eviction while the block reads it."""
        slot, path = await self._local(adapter)
        self._held[slot] += 1
        try:
            yield path
        finally:
            self._held[slot] -= 1
            if self._held[slot] <= 0:
                del self._held[slot]
                self._evict()  # it may have kept the tier over max_bytes

    async def _local(self, adapter: str | AdapterId) -> tuple[str, Path]:
        aid = parse_adapter_id(adapter) if isinstance(adapter, str) else adapter
        try:
            info = await self.registry.info(aid)
        except AdapterNotFound:
            if aid.version is not None:
                self._dead.add(str(aid))
            raise
        slot = _slot(info)
        entry = self._entries.get(slot)
        if entry is not None and entry.path.is_dir():
            entry.used = self._clock()
            self._entries.move_to_end(slot)
            return slot, entry.path
        task = self._fetching.get(slot)
        if task is None:
            task = asyncio.create_task(self._fetch(info, slot))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._fetching[slot] = task
        return slot, await asyncio.shield(task)

    async def _fetch(self, info: AdapterRecord, slot: str) -> Path:
        try:
            try:
                config, weights = await self.registry.files(info.id)
            except AdapterNotFound:
                self._dead.add(str(info.id))
                raise
            self.fetches += 1
            path = await asyncio.to_thread(self._install, info, slot, config, weights)
            size = len(config) + len(weights)
            self._entries[slot] = _Entry(path, size, self._clock(), info.pinned)
            self._entries.move_to_end(slot)
            self._evict(keep=slot)
            return path
        finally:
            self._fetching.pop(slot, None)

    def _install(self, info: AdapterRecord, slot: str, config: bytes, weights: bytes) -> Path:
        for name, data, want in (
            (CONFIG, config, info.manifest.config_sha256),
            (WEIGHTS, weights, info.manifest.weights_sha256),
        ):
            if hashlib.sha256(data).hexdigest() != want:
                raise InternalError(f"adapter {info.id}: the stored {name} fails its sha256")
        dest = self.dir / slot
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.mkdir()
            (tmp / CONFIG).write_bytes(config)
            (tmp / WEIGHTS).write_bytes(weights)
            if dest.exists():  # left by an earlier run without its files, or complete
                shutil.rmtree(dest)
            tmp.rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def _evict(self, keep: str = "") -> None:
        total = self.nbytes
        for slot in list(self._entries):
            if total <= self.max_bytes:
                break
            entry = self._entries[slot]
            if slot == keep or self._held[slot] or entry.pinned or slot in self._fetching:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            del self._entries[slot]
            total -= entry.nbytes

    def forget(self, adapter: str | AdapterId) -> int:
        """Drop an adapter's local copies (every version when the id has none), e.g.
        once it is deleted; returns how many. Held ones stay until released."""
        aid = parse_adapter_id(adapter) if isinstance(adapter, str) else adapter
        head = f"{aid.key}/" if aid.version is None else f"{aid.key}/{aid.version}-"
        if aid.version is not None:
            self._dead.add(str(aid))
        gone = 0
        for slot in [s for s in self._entries if s.startswith(head) and not self._held[s]]:
            shutil.rmtree(self._entries.pop(slot).path, ignore_errors=True)
            gone += 1
        return gone

    def _scan(self) -> None:
        """Adopt what an earlier run left (oldest use first); drop half-made copies."""
        for tmp in self.dir.glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        found = []
        for path in self.dir.glob("*/*/*"):
            files = [path / CONFIG, path / WEIGHTS]
            if path.is_dir() and all(f.is_file() for f in files):
                size = sum(f.stat().st_size for f in files)
                found.append((path.stat().st_mtime, path.relative_to(self.dir).as_posix(), size))
        for used, slot, size in sorted(found):
            self._entries[slot] = _Entry(self.dir / slot, size, used)
