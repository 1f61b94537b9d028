"""The catalog directory's watcher: a spec file that appears there (or changes) is
served without a restart, one that leaves is drained and unloaded (``hot_models``).

It polls the directory every ``POLL_S`` seconds, comparing each file's mtime and size
(no dependency, and the same on every filesystem a container mounts). A file that does
not parse is logged in one line and looked at again only once it changes; the others
go on. ``--watch-catalog false`` turns it off.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol

from .catalog import ModelSpec, read_spec, spec_files

log = logging.getLogger("fleetserve.models")
POLL_S = 0.5

Stamp = tuple[int, int]  # mtime_ns, size


class Changes(Protocol):
    """What the watcher asks of the process's models (``hot_models.HotModels``)."""

    def serves(self, spec: ModelSpec) -> bool:
        """``spec`` is served as it is (same id, same fields)."""
        ...

    async def adopt(self, spec: ModelSpec, where: object) -> bool: ...

    async def forget(self, model: str) -> bool: ...


class CatalogWatch:
    """Watches ``directory`` for ``models``. Built when the catalog is read (the files
    there then are the served ones), run in the process's task group."""

    def __init__(self, directory: Path, models: Changes, *, poll_s: float = POLL_S) -> None:
        self.directory = directory
        self.models = models
        self.poll_s = poll_s
        self.stamps: dict[Path, Stamp] = {}
        self.ids: dict[Path, str] = {}  # the model each file defines (those that parse)
        for f, stamp in self._scan().items():  # what the catalog was read from
            self.stamps[f] = stamp
            try:
                self.ids[f] = read_spec(f).id
            except ValueError:
                continue  # the start logged it, or it was never served

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.poll_s)
            await self.step()

    async def step(self) -> None:
        """One look: serve what appeared or changed, remove what left."""
        now = self._scan()
        for f in [f for f in self.stamps if f not in now]:
            del self.stamps[f]
            model = self.ids.pop(f, None)
            if model is not None and await self.models.forget(model):
                log.info("%s left the catalog directory: removed %s", f.name, model)
        for f, stamp in now.items():
            if self.stamps.get(f) != stamp:
                self.stamps[f] = stamp
                await self._changed(f)

    async def _changed(self, f: Path) -> None:
        try:
            spec = read_spec(f)
        except ValueError as exc:  # one line; the others go on
            log.warning("catalog watch: %s", exc)
            return
        before = self.ids.get(f)
        self.ids[f] = spec.id
        if before is not None and (before != spec.id or not self.models.serves(spec)):
            await self.models.forget(before)  # changed: served again with the new spec
        if await self.models.adopt(spec, f):
            log.info("%s: added %s from the catalog directory", f.name, spec.id)

    def _scan(self) -> dict[Path, Stamp]:
        try:
            files = spec_files(self.directory)
        except ValueError:  # the directory went away: its models too
            return {}
        out: dict[Path, Stamp] = {}
        for f in files:
            try:
                st = f.stat()
            except OSError:  # removed while listed
                continue
            out[f] = (st.st_mtime_ns, st.st_size)
        return out
