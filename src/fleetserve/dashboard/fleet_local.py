"""What one worker holds, read in its own process: for the embedded fleet view, and
for the heartbeat a distributed worker publishes (``worker_figures``).

Both describe a worker the same way (``worker_state``), so the fleet view shows an
embedded server and a cluster alike: its models and their state, bytes against the
memory budget, the adapters hot on each model, and its queue and eviction counters.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from ..fleet.memory import process_limit_bytes
from ..wire import Priority
from ..worker.lora_tier import host_of

if TYPE_CHECKING:
    from ..fleet.manager import Fleet
    from ..metrics import Metrics
    from ..queue.base import QueueStats
    from ..queue.memory import MemoryQueue
    from ..worker.runner import Runner

COUNTERS = ("put_backs", "redeliveries", "dead_letters", "evictions")


def by_label(
    metric: Any, label: str = "model", where: Mapping[str, str] | None = None
) -> dict[str, int]:
    """A Prometheus counter's non-zero totals summed by one label (``where``: only the
    samples whose labels have those values)."""
    out: dict[str, int] = {}
    for family in metric.collect():
        for s in family.samples:
            if not s.name.endswith("_total"):
                continue
            if where and any(s.labels.get(k) != v for k, v in where.items()):
                continue
            key = s.labels.get(label, "")
            out[key] = out.get(key, 0) + int(s.value)
    return {k: v for k, v in out.items() if v}


def errors_by_model(metrics: Metrics) -> dict[str, int]:
    """Requests per model that the gateway answered with an error (any code but ok)."""
    out: dict[str, int] = {}
    for family in metrics.requests.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.labels.get("code") != "ok" and s.value:
                model = s.labels.get("model", "")
                out[model] = out.get(model, 0) + int(s.value)
    return out


def hot_adapters(runner: Runner) -> list[str]:
    """The adapters hot on ``runner``'s model (in its LoRA bank), least recent first."""
    try:
        host = host_of(runner.adapters.host_family)  # what holds the bank: the family or runtime
        return list(host.lora_bank().keys()) if host is not None else []
    except Exception:  # a model between loads: nothing hot
        return []


class Figures(TypedDict):
    """A worker's counters and hot adapters (heartbeat fields of the same names)."""

    counters: dict[str, dict[str, int]]
    adapters: dict[str, list[str]]


def worker_figures(
    runners: Mapping[str, Runner], stats: QueueStats | None, metrics: Metrics
) -> Figures:
    """The fleet view's extra heartbeat fields: ``counters`` (put-backs, redeliveries,
    dead letters and evictions per model, running counts) and ``adapters`` (the hot
    adapters per model)."""
    counters: dict[str, dict[str, int]] = {
        "put_backs": dict(stats.put_backs) if stats else {},
        "redeliveries": dict(stats.redeliveries) if stats else {},
        "dead_letters": dict(stats.dead_letters) if stats else {},
        "evictions": by_label(metrics.evictions),
    }
    adapters = {m: hot for m, r in runners.items() if (hot := hot_adapters(r))}
    return Figures(counters=counters, adapters=adapters)


def worker_state(
    node: str,
    fleet: Fleet,
    runners: Mapping[str, Runner],
    stats: QueueStats | None,
    metrics: Metrics,
    *,
    ready: bool,
    device: str,
    tuning: Callable[[str], Mapping[str, object]] | None = None,
) -> dict[str, object]:
    """A worker as the fleet view shows it (the shape of a normalized heartbeat);
    ``tuning``: each model's background tuning state (``--tune auto``)."""
    beat = {
        "id": node,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "ready": ready,
        "device": device,
        "memory": {**fleet.memory(), "host": process_limit_bytes()},
        "models": {
            m: {**fleet.info(m), **({"tuning": tuning(m)} if tuning else {})} for m in runners
        },
        **worker_figures(runners, stats, metrics),
    }
    return normalize(beat)


def normalize(beat: Mapping[str, Any]) -> dict[str, Any]:
    """A heartbeat (``WorkerProcess.describe``), defensively: a worker of an older
    version may lack any field; the models become a list, the counters dicts of ints."""
    memory = _mapping(beat.get("memory"))
    hot = _mapping(beat.get("adapters"))
    models = []
    raw_models = beat.get("models")
    for model, info in raw_models.items() if isinstance(raw_models, Mapping) else []:
        info = info if isinstance(info, Mapping) else {}
        keys = hot.get(model)
        models.append(
            {
                "id": str(model),
                "state": str(info.get("state") or ("resident" if info.get("loaded") else "cold")),
                "bytes": _int(info.get("bytes")),
                "pinned": bool(info.get("pinned")),
                "inflight": _int(info.get("inflight")),
                "error": info.get("error"),
                "adapters": [str(k) for k in keys] if isinstance(keys, list) else [],
                "tuning": _tuning(info.get("tuning")),
            }
        )
    counters = _mapping(beat.get("counters"))
    return {
        "id": str(beat.get("id", "")),
        "host": beat.get("host"),
        "pid": beat.get("pid"),
        "ready": bool(beat.get("ready")),
        "device": beat.get("device"),
        "memory": {
            "budget": _int(memory.get("budget")),
            "used": _int(memory.get("used")),
            "host": _int(memory.get("host")),
            "host_tier_budget": _int(memory.get("host_tier_budget")),
            "host_tier_used": _int(memory.get("host_tier_used")),
        },
        "models": models,
        "counters": {
            name: {str(k): _int(v) for k, v in c.items()}
            for name in COUNTERS
            if isinstance(c := counters.get(name), Mapping)
        },
    }


def _tuning(raw: object) -> dict[str, object] | None:
    """A model's background tuning state, as the fleet view shows it."""
    if not isinstance(raw, Mapping):
        return None
    figure = {k: v if isinstance(v, int | float) else None for k, v in raw.items()}
    return {
        "state": str(raw.get("state") or "off"),
        "reason": str(raw.get("reason") or ""),
        "phase": str(raw.get("phase") or ""),
        "swaps": _int(raw.get("swaps")),
        "before_tokens_s": figure.get("before_tokens_s"),
        "after_tokens_s": figure.get("after_tokens_s"),
        "run": raw.get("run") if isinstance(raw.get("run"), str) else None,
        "error": raw.get("error") if isinstance(raw.get("error"), str) else None,
    }


def memory_lanes(queue: MemoryQueue) -> list[dict[str, Any]]:
    """Each lane (model and class) of the in-process queue: waiting, in flight, and
    the age of its oldest waiting request, in seconds."""
    now = time.time()
    lanes = queue._queues  # the queue's own lanes: (model, class) -> FIFO
    inflight = Counter((m.envelope.model, m.envelope.priority) for m in queue._inflight.values())
    out = []
    for key in sorted(set(lanes) | set(inflight), key=lambda k: (k[0], k[1].value)):
        waiting = lanes.get(key) or ()
        oldest = min((m.envelope.enqueued_at for m in waiting), default=None)
        out.append(
            {
                "model": key[0],
                "class": Priority(key[1]).value,
                "waiting": len(waiting),
                "inflight": inflight.get(key, 0),
                "age_s": max(0.0, now - oldest) if oldest else 0.0,
            }
        )
    return out


def _mapping(v: object) -> Mapping[str, object]:
    return v if isinstance(v, Mapping) else {}


def _int(v: object) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


__all__ = [
    "COUNTERS",
    "Figures",
    "by_label",
    "errors_by_model",
    "hot_adapters",
    "memory_lanes",
    "normalize",
    "worker_figures",
    "worker_state",
]
