"""The tuning view's data: ``GET /v1/tuning/runs`` and ``GET /v1/tuning/runs/{id}``.

Run documents are files in the run store (``Settings.tune_dir``), rewritten by the tuner
while it runs. Reading them here is defensive:

- each file is parsed only when its modification time or size changed;
- a file that does not parse (a writer that does not rename, a broken file) keeps the
  last version that did, or is left out when there never was one;
- documents are passed through as written: the page copes with missing fields.
"""

from __future__ import annotations

import asyncio
import logging
import os

from ..bench.tune.runs import RunStore, summary
from ..wire import NotFound

log = logging.getLogger("fleetserve.dashboard")

_Stat = tuple[int, int]  # (mtime_ns, size)


class TuningView:
    """Tuning runs: candidates, quality gates, the knee and the chosen profile."""

    name = "tuning"
    prefix = "/v1/tuning/"
    script = "tuning.js"

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._cache: dict[str, tuple[_Stat, dict[str, object]]] = {}

    async def version(self) -> str:
        return await asyncio.to_thread(self.version_now)

    async def data(self, subpath: str) -> object:
        if subpath == "runs":
            return {"object": "list", "data": await asyncio.to_thread(self.summaries)}
        if subpath.startswith("runs/"):
            # the ASGI path is decoded already; RunStore.path refuses unsafe ids
            return await asyncio.to_thread(self.run, subpath[len("runs/") :])
        raise NotFound(f"no route for GET {self.prefix}{subpath}", field="path")

    # -- blocking reads (run in a thread) -------------------------------------------

    def version_now(self) -> str:
        """Changes when a run is written, added or removed: like ``RunStore.mtime()``,
        plus the number of runs so that removing an older one counts too."""
        files = self._files()
        newest = max((st[0] for st in files.values()), default=0)
        return f"{len(files)}-{newest}-{sum(st[1] for st in files.values())}"

    def summaries(self) -> list[dict[str, object]]:
        """A summary of every readable run, newest first."""
        files = self._files()
        for gone in self._cache.keys() - files.keys():
            self._cache.pop(gone, None)
        runs = [doc for run_id, st in files.items() if (doc := self._load(run_id, st))]
        out = [_summary(doc) for doc in runs]
        out.sort(key=lambda r: (str(r.get("started_at") or ""), str(r["id"])), reverse=True)
        return out

    def run(self, run_id: str) -> dict[str, object]:
        """The whole document of ``run_id``, or ``NotFound`` naming it."""
        try:
            st = os.stat(self.store.path(run_id))
        except (KeyError, OSError):
            raise NotFound(f"no tuning run {run_id!r}", field="id") from None
        doc = self._load(run_id, (st.st_mtime_ns, st.st_size))
        if doc is None:
            raise NotFound(f"tuning run {run_id!r} is unreadable", field="id")
        return doc

    def _files(self) -> dict[str, _Stat]:
        """``{run id: (mtime_ns, size)}`` of the run files in the store."""
        out: dict[str, _Stat] = {}
        try:
            with os.scandir(self.store.root) as it:
                for entry in it:
                    name = entry.name
                    if name.startswith(".") or not name.endswith(".json"):
                        continue
                    try:
                        if entry.is_file():
                            st = entry.stat()
                            out[name[: -len(".json")]] = (st.st_mtime_ns, st.st_size)
                    except OSError:
                        continue
        except OSError:  # no store yet, or not readable
            return {}
        return out

    def _load(self, run_id: str, st: _Stat) -> dict[str, object] | None:
        cached = self._cache.get(run_id)
        if cached is not None and cached[0] == st:
            return cached[1]
        try:
            doc = self.store.get(run_id)
        except KeyError:  # unsafe name, or the file does not parse (now)
            log.debug("tuning run %s is unreadable; keeping its last good version", run_id)
            return cached[1] if cached is not None else None
        if doc.get("id") != run_id:
            log.debug("tuning run file %s.json holds id %r; left out", run_id, doc.get("id"))
            return None
        self._cache[run_id] = (st, doc)
        return doc


def _summary(doc: dict[str, object]) -> dict[str, object]:
    """``tune.runs.summary``, safe with a malformed ``candidates`` field."""
    if not isinstance(doc.get("candidates"), list | None):
        doc = {**doc, "candidates": []}
    return summary(doc)


__all__ = ["TuningView"]
