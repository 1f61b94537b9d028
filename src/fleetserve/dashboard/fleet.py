"""The fleet view's data: ``GET /v1/fleet``, one JSON snapshot of the whole fleet.

- ``workers``: each worker, its models (state, bytes, hot adapters), memory used
  against its budget, its counters;
- ``models``: per catalog model, where it is resident, its queue lanes (waiting, in
  flight, the oldest one's age, per class), throughput and p50 / p99 over the last
  ``window_s`` seconds as the gateway saw the replies, errors, and put-backs,
  redeliveries, dead letters and evictions summed over the workers;
- ``adapters``: the registered adapters per base model, and where each is hot;
- ``totals``: the same figures for the whole fleet.

``version()`` reuses a snapshot up to ``refresh_s`` old, so that the event streams
(which ask every tick) cost at most one a second and only while someone looks; a GET
always takes a fresh one. The server attaches its source (:mod:`.fleet_sources`) at
start; without one the view is empty.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from ..wire import NotFound, Principal, Scope
from .fleet_local import COUNTERS, errors_by_model
from .fleet_sources import FleetSource, Gathered
from .window import Recent

log = logging.getLogger("fleetserve.dashboard")
STATE_ORDER = ("resident", "loading", "failed")  # a model's fleet state: first one held
ADAPTERS_EVERY = 5.0  # seconds between listings of the registered adapters
LISTER = Principal("fleet-dashboard", frozenset({Scope.ADMIN}))


class FleetView:
    """Workers, resident models, queue lag, throughput and latency, adapters."""

    name = "fleet"
    prefix = "/v1/fleet"
    script = "fleet.js"

    def __init__(self, recent: Recent | None = None, refresh_s: float = 1.0) -> None:
        self.recent = recent or Recent()
        self.refresh_s = refresh_s
        self.source: FleetSource | None = None
        self._snap: tuple[float, dict[str, object], str] = (-1e9, {}, "")
        self._lock = asyncio.Lock()
        self._registered: tuple[float, dict[str, list[dict[str, object]]]] = (-1e9, {})
        self.adapters_every = ADAPTERS_EVERY

    def attach(self, source: FleetSource) -> None:
        self.source = source
        self._snap = (-1e9, {}, "")

    async def version(self) -> str:
        try:
            return (await self.snapshot(self.refresh_s))[1]
        except Exception:
            log.exception("fleet view: snapshot failed")
            return self._snap[2]

    async def data(self, subpath: str) -> object:
        if subpath in ("", "/"):  # fresh: a GET sees what just happened
            return (await self.snapshot())[0]
        raise NotFound(f"no route for GET {self.prefix}{subpath}", field="path")

    async def snapshot(self, max_age: float = 0.0) -> tuple[dict[str, object], str]:
        """A snapshot at most ``max_age`` seconds old, and its version (a digest of
        everything but the time it was taken)."""
        async with self._lock:
            at, snap, version = self._snap
            now = time.monotonic()
            if now - at >= max_age or not snap:
                snap = await self._build()
                body = json.dumps(snap, sort_keys=True, default=str).encode()
                version = hashlib.sha256(body).hexdigest()[:16]
                snap["generated_at"] = datetime.now(UTC).isoformat(timespec="milliseconds")
                self._snap = (now, snap, version)
            return snap, version

    async def _build(self) -> dict[str, object]:
        if self.source is None:
            return _assemble("none", Gathered([], [], None, []), [], {}, {}, {},
                             (self.recent.window_s, self.recent.rate_s))  # fmt: skip
        src = self.source
        gathered = await src.gather()
        catalog = [(s.id, s.family) for s in src.catalog]
        registered = await self._adapters()
        return _assemble(
            src.mode, gathered, catalog, self.recent.summary(), errors_by_model(src.metrics),
            registered, (self.recent.window_s, self.recent.rate_s),
        )  # fmt: skip

    async def _adapters(self) -> dict[str, list[dict[str, object]]]:
        """The registered adapters per base, listed at most every ``adapters_every`` s."""
        at, cached = self._registered
        adapters = self.source.adapters if self.source is not None else None
        if adapters is None or time.monotonic() - at < self.adapters_every:
            return cached
        try:
            infos = await adapters.registry.list(LISTER)
        except Exception as exc:  # the store is unreachable now: the last listing
            log.debug("fleet view: adapters not listed: %s", exc)
            return cached
        out: dict[str, list[dict[str, object]]] = {}
        for info in infos:
            out.setdefault(info.base, []).append(
                {"id": str(info.id), "rank": info.rank, "pinned": info.pinned}
            )
        self._registered = (time.monotonic(), out)
        return out


def _assemble(
    mode: str,
    g: Gathered,
    catalog: list[tuple[str, str]],
    recent: dict[str, dict[str, Any]],
    errors: dict[str, int],
    registered: dict[str, list[dict[str, object]]],
    windows: tuple[float, float],
) -> dict[str, object]:
    known = dict(catalog)
    for lane in g.lanes:  # a lane of a model this gateway does not list: still shown
        known.setdefault(lane["model"], "")
    counters = {name: _sum(w["counters"].get(name, {}) for w in g.workers) for name in COUNTERS}
    if g.dead_letters is not None:
        counters["dead_letters"] = dict(g.dead_letters)
    models = []
    for model, family in known.items():
        held = [(w["id"], m) for w in g.workers for m in w["models"] if m["id"] == model]
        states = {m["state"] for _, m in held}
        lanes = {
            lane["class"]: {
                "waiting": lane["waiting"],
                "inflight": lane["inflight"],
                "age_s": round(lane["age_s"], 1),  # steadier versions: 0.1 s is enough
            }
            for lane in g.lanes
            if lane["model"] == model
        }
        seen = recent.get(model, {})
        hot: dict[str, list[str]] = {}
        for wid, m in held:
            for key in m["adapters"]:
                hot.setdefault(key, []).append(wid)
        models.append(
            {
                "id": model,
                "family": family,
                "state": next((s for s in STATE_ORDER if s in states), "cold"),
                "resident_on": [wid for wid, m in held if m["state"] == "resident"],
                "bytes": max((m["bytes"] for _, m in held), default=0),
                "lanes": lanes,
                "waiting": sum(v["waiting"] for v in lanes.values()),
                "inflight": sum(v["inflight"] for v in lanes.values()),
                "age_s": max((v["age_s"] for v in lanes.values()), default=0.0),
                "requests": seen.get("requests", 0),
                "total": seen.get("total", 0),
                "rps": round(seen.get("rps", 0.0), 3),
                "p50_ms": _ms(seen.get("p50_ms")),
                "p99_ms": _ms(seen.get("p99_ms")),
                "errors": errors.get(model, 0),
                **{name: counters[name].get(model, 0) for name in COUNTERS},
                "adapters": {"registered": len(registered.get(model, [])), "hot": hot},
                "tuning": next((m["tuning"] for _, m in held if m.get("tuning")), None),
            }
        )
    return {
        "object": "fleet",
        "mode": mode,
        "window_s": windows[0],  # the percentiles' and the requests' window
        "rate_s": windows[1],  # the throughput's
        "notes": g.notes,
        "workers": g.workers,
        "models": models,
        "adapters": _adapters(registered, models),
        "totals": _totals(g, models),
    }


def _adapters(
    registered: dict[str, list[dict[str, Any]]], models: list[dict[str, Any]]
) -> list[dict[str, object]]:
    """Per base model: its registered adapters, and the workers each is hot on."""
    hot = {m["id"]: m["adapters"]["hot"] for m in models}
    bases = sorted(set(registered) | {b for b, h in hot.items() if h})
    return [{"base": b, "registered": registered.get(b, []), "hot": hot.get(b, {})} for b in bases]


def _totals(g: Gathered, models: list[dict[str, Any]]) -> dict[str, Any]:
    total = {k: sum(m[k] for m in models) for k in (
        "waiting", "inflight", "requests", "total", "rps", "errors", *COUNTERS)}  # fmt: skip
    return {
        **total,
        "workers": len(g.workers),
        "ready": sum(1 for w in g.workers if w["ready"]),
        "resident": sum(1 for w in g.workers for m in w["models"] if m["state"] == "resident"),
        "memory_used": sum(w["memory"]["used"] for w in g.workers),
        "memory_budget": sum(w["memory"]["budget"] for w in g.workers),
        # each host's memory once, however many of its workers report it
        "memory_host": sum({w["host"]: w["memory"].get("host", 0) for w in g.workers}.values()),
        "age_s": max((m["age_s"] for m in models), default=0.0),
    }


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _sum(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


__all__ = ["FleetView"]
