"""Hot add and remove in a serving process: ``POST /v1/models``, ``DELETE
/v1/models/{id}`` (``gateway/model_routes.py``) and the catalog directory's watcher
(``catalog_watch.py``) change the models here, without a restart.

An added model gets a runner built as at start (its profile chosen by the same
``Profiles.choose``), joins the fleet and the worker (a batch loop of its own), then
the catalog: from that moment the gateway routes to it. It loads on first use, or
before it is listed if ``pinned``. A removed model leaves the catalog first (new
requests get 404), then the worker drains it (``Worker.retire``: its queued requests
get a 404 naming it, those under way finish), then the fleet unloads it. One change
at a time (a lock), so the watcher and the API never race over one id.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml
from rich.console import Console

from .assembly import build_runner, load_or_report
from .catalog import Catalog, ModelSpec
from .catalog.fetch import is_object_uri
from .catalog.sources import locate
from .metrics import Metrics
from .settings import Settings
from .stack import Stack
from .wire import Conflict, InvalidInput
from .worker import Worker
from .worker.runner import Runner

log = logging.getLogger("fleetserve.models")
DRAIN_SLACK_S = 5.0  # past the longest request deadline: what a drain waits at most


class Served(Protocol):
    """The process whose models change: its stack (a quick tune rebuilds it) and its
    worker, read at each change."""

    def served_stack(self) -> Stack: ...

    def served_worker(self) -> Worker: ...


class HotModels:
    """Adds and removes the models of one process (a ``gateway.model_routes.ModelAdmin``).

    ``listing``: the process's ``GET /v1/models`` entries (an added model's is
    returned); ``catalog_dir``: where an added spec is written (atomically, so that it
    survives a restart), None where the process has no writable one; ``tracked``: told
    of each model added or removed (the background tuner's states)."""

    def __init__(
        self,
        served: Served,
        settings: Settings,
        catalog: Catalog,
        metrics: Metrics,
        console: Console,
        *,
        listing: Callable[[], list[dict[str, Any]]],
        catalog_dir: Path | None = None,
        tracked: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.served, self.settings, self.catalog = served, settings, catalog
        self.metrics, self.console = metrics, console
        self.listing = listing
        self.catalog_dir = catalog_dir
        self.tracked = tracked
        self.written: dict[str, Path] = {}  # the spec files this process wrote, by id
        # lets an added runner serve LoRA adapters (adapters_setup.Hosting.host), once
        # the process hosts them
        self.hosting: Callable[[Runner], None] | None = None
        self.lock = asyncio.Lock()  # one change at a time
        s = settings
        self.drain_s = max(s.request_timeout, s.generation_timeout, s.max_request_timeout)
        self.drain_s += DRAIN_SLACK_S

    # -- the API's (ModelAdmin) ------------------------------------------------------
    async def add(self, spec: ModelSpec, fields: Mapping[str, object]) -> dict[str, Any]:
        """Serve ``spec``, write ``fields`` to the catalog directory, return its entry.
        A 400 naming the sources if none holds weights here (an ``s3://`` one is
        fetched on first use: it is not looked for now)."""
        self._check_present(spec)
        async with self.lock:
            await self._serve(spec)
            self._write(spec.id, fields)
        return self.info(spec.id)

    async def remove(self, model: str) -> None:
        """Drain ``model`` and unload it; its spec file goes too if this process wrote it."""
        async with self.lock:
            await self._remove(model)

    def _check_present(self, spec: ModelSpec) -> None:
        if any(is_object_uri(s) for s in spec.sources):
            return
        s = self.settings
        if locate(spec.sources, Path(s.hf_cache).expanduser(), Path(s.cache_dir).expanduser()):
            return
        raise InvalidInput(
            f"no weights for {spec.id!r} at {', '.join(spec.sources)}: each source is "
            "absent or an empty directory on the server",
            field="sources",
        )

    def info(self, model: str) -> dict[str, Any]:
        """``model``'s entry of ``GET /v1/models``."""
        return next(m for m in self.listing() if m["id"] == model)

    # -- the watcher's ---------------------------------------------------------------
    def serves(self, spec: ModelSpec) -> bool:
        """``spec`` is served as it is (same id, same fields)."""
        return spec.id in self.catalog and self.catalog.get(spec.id) == spec

    async def adopt(self, spec: ModelSpec, where: object) -> bool:
        """A spec appeared or changed (in file ``where``, or the fleet's bucket): serve
        ``spec`` unless its id is served already (the same spec: this process wrote it;
        another: logged). True if added. A file gone by the time the lock is free is
        not served: a remove that held the lock (an add, then a remove within one poll
        of the watcher) deleted it, and serving it would bring the model back."""
        async with self.lock:
            if isinstance(where, Path) and not where.exists():
                return False
            if spec.id in self.catalog:
                if not self.serves(spec):
                    log.warning("%s: model %r is served already; remove it first", where, spec.id)
                return False
            await self._serve(spec)
            return True

    async def forget(self, model: str) -> bool:
        """A spec file left (or changed id): drain and unload ``model`` if served."""
        async with self.lock:
            if model not in self.catalog:
                return False
            await self._remove(model)
            return True

    # -- the fleet's bucket (distributed mode: queue.js_models) -------------------------
    async def put(self, model: str, fields: dict[str, object]) -> None:
        """The fleet serves ``model`` with spec ``fields``: here too (anew if changed)."""
        spec = ModelSpec.from_dict(fields)
        if model in self.catalog and not self.serves(spec):
            await self.forget(model)
        await self.adopt(spec, "the fleet's models bucket")

    # -- both -------------------------------------------------------------------------
    async def _serve(self, spec: ModelSpec) -> None:
        if spec.id in self.catalog:
            raise Conflict(f"model {spec.id!r} is served already; remove it first", field="id")
        stack, worker = self.served.served_stack(), self.served.served_worker()
        choice = stack.profiles.choose(spec)
        runner = build_runner(spec, self.settings, self.metrics, choice)
        if self.hosting is not None:
            self.hosting(runner)
        stack.choices[spec.id], stack.runners[spec.id] = choice, runner
        stack.fleet.add(runner)
        if runner.eager:  # pinned: loaded before it is listed (the others on first use)
            await load_or_report(stack.fleet, runner, self.console)
        worker.add_runner(runner)
        self.catalog.add(spec)  # from now on the gateway routes to it
        if self.tracked is not None:
            self.tracked(spec.id, True)
        log.info("added %s (%s, %s)", spec.id, spec.family, choice.describe())

    async def _remove(self, model: str) -> None:
        self.catalog.get(model)  # ModelNotFound naming it
        self.catalog.discard(model)  # new requests: 404
        stack = self.served.served_stack()
        if not await self.served.served_worker().retire(model, self.drain_s):
            log.warning("%s: requests still held after %.0fs; removed anyway", model, self.drain_s)
        stack.runners.pop(model, None)
        stack.choices.pop(model, None)
        if self.tracked is not None:
            self.tracked(model, False)
        path = self.written.pop(model, None)
        if path is not None:
            path.unlink(missing_ok=True)
        log.info("removed %s", model)

    def _write(self, model: str, fields: Mapping[str, object]) -> None:
        """``fields`` to ``<catalog_dir>/<id>.yaml`` (``/`` as ``__``), atomically."""
        d = self.catalog_dir
        if d is None:
            return
        path = d / (model.replace("/", "__") + ".yaml")
        if path.exists():  # another spec's file by that name: never overwritten
            log.warning("%s: served, but its spec was not written: %s exists", model, path)
            return
        tmp = d / f".{path.name}.{os.getpid()}.tmp"  # not a spec file: the watcher skips it
        try:
            tmp.write_text(yaml.safe_dump(dict(fields), sort_keys=False), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning("%s: served, but its spec was not written: %s", model, exc.strerror)
            return
        self.written[model] = path


def writable_dir(settings: Settings) -> Path | None:
    """The catalog directory (``--catalog``) if this process may write to it."""
    if not settings.catalog:
        return None
    d = Path(settings.catalog).expanduser()
    return d if d.is_dir() and os.access(d, os.W_OK) else None


__all__ = ["HotModels", "Served", "writable_dir"]
