"""A worker pool's KEDA ``lagThreshold``, from the tuned capacity of one replica.

KEDA's ``nats-jetstream`` scaler reads one durable consumer's lag (its
``num_pending + num_ack_pending``, messages) and the HPA asks for
``ceil(lag / lagThreshold)`` replicas. fleetserve has one consumer per model and
priority class (``w-<model token>`` for batch work, ``wi-<model token>`` for
interactive work, on the ``<PREFIX>_WORK`` stream), so a pool gets one trigger per
model and class, and the HPA follows the busiest of them.

The threshold is the work one replica clears in a target wait:
``lagThreshold = ceil(requests/s per replica x wait seconds)`` (10 s for batch work,
1 s for interactive work by default). A replica's requests/s come from the model's
tuned profile for the pool's hardware class (or the class that stands in for it):

1. ``provenance.figures.knee_rps``: the open-loop knee that ``fleetserve tune``
   measured through the real serving path (requests/s at which p99 starts to climb);
2. otherwise the fitted cost model: a full batch (``max_batch_size`` requests of
   ``max_batch_tokens / max_batch_size`` tokens) per its predicted time.

``python -m fleetserve.ops.capacity --pool NAME --hardware-class CLASS --pin MODEL``
prints the pool as a Helm values snippet (``workerPools``) for
``deploy/helm/fleetserve``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..catalog.profiles import ProfileFile, bundled_dir, profile_path, read_profile_file
from ..catalog.rules import fallback_chain
from ..wire import Priority
from ..wire.headers import subject_token

BATCH_WAIT_S = 10.0  # a batch backlog one replica clears in this long is on target
INTERACTIVE_WAIT_S = 1.0  # interactive work should wait about a second at most


@dataclass(frozen=True)
class ModelCapacity:
    """What one replica serves of ``model`` on a hardware class, and where it came from."""

    model: str
    hardware_class: str  # the class whose profile was used (maybe a fallback)
    rps: float
    source: str


@dataclass(frozen=True)
class LaneThreshold:
    """One KEDA trigger: a model's class lane, its durable consumer and threshold."""

    model: str
    priority: Priority
    consumer: str
    lag_threshold: int


def consumer_name(model: str, priority: Priority) -> str:
    """The durable consumer of a lane, as the worker names it (``queue.js_pull``)."""
    kind = "w" if priority is Priority.BATCH else "wi"
    return f"{kind}-{subject_token(model)}"


def find_profile(
    model: str, hardware_class: str, profile_dir: Path | None = None
) -> ProfileFile | None:
    """The tuned profile of ``model`` for ``hardware_class`` or the nearest class in its
    fallback chain; yours (``profile_dir``) before the bundled one, as the worker picks."""
    for cls in (hardware_class, *fallback_chain(hardware_class)):
        roots = [(profile_dir, False)] if profile_dir else []
        for root, bundled in [*roots, (bundled_dir(), True)]:
            assert root is not None
            path = profile_path(root, model, cls)
            if path.is_file():
                return read_profile_file(path, cls, bundled)
    return None


def model_capacity(
    model: str, hardware_class: str, profile_dir: Path | None = None
) -> ModelCapacity:
    """Requests/s one replica serves of ``model``: the tuned knee, else the cost model.

    A ``ValueError`` when nothing was tuned for the class or its fallbacks: a
    threshold guessed from rules would scale on a number nobody measured.
    """
    pf = find_profile(model, hardware_class, profile_dir)
    if pf is None:
        chain = ", ".join(fallback_chain(hardware_class)) or "none"
        raise ValueError(
            f"no tuned profile for {model} on {hardware_class} (fallbacks: {chain}): run "
            f"`fleetserve tune {model}` on that hardware, or give --rps {model}=N"
        )
    figures = (pf.provenance.get("figures") or {}) if isinstance(pf.provenance, dict) else {}
    knee = figures.get("knee_rps") if isinstance(figures, dict) else None
    date = pf.provenance.get("date", "?")
    if isinstance(knee, int | float) and knee > 0:
        return ModelCapacity(
            model, pf.hardware_class, float(knee), f"knee_rps, tuned on {pf.hardware_class} {date}"
        )
    p = pf.profile
    max_len = max(1, p.max_batch_tokens // max(1, p.max_batch_size))
    ms = p.cost.predict_ms(p.max_batch_tokens, max_len, p.max_batch_size)
    rps = p.max_batch_size / max(ms, 1e-3) * 1e3
    source = f"cost model, {pf.hardware_class} {date}: {p.max_batch_size} per {ms:.1f} ms"
    return ModelCapacity(model, pf.hardware_class, rps, source)


def lag_threshold(rps: float, wait_s: float) -> int:
    """Messages one replica clears in ``wait_s`` seconds (at least 1)."""
    return max(1, math.ceil(rps * wait_s))


def lane_thresholds(
    capacity: ModelCapacity,
    batch_wait: float = BATCH_WAIT_S,
    interactive_wait: float = INTERACTIVE_WAIT_S,
) -> list[LaneThreshold]:
    """The two triggers of a model: batch and interactive."""
    waits = {Priority.BATCH: batch_wait, Priority.INTERACTIVE: interactive_wait}
    return [
        LaneThreshold(
            capacity.model, p, consumer_name(capacity.model, p), lag_threshold(capacity.rps, w)
        )
        for p, w in waits.items()
    ]


def lag_thresholds(
    capacities: Sequence[ModelCapacity],
    batch_wait: float = BATCH_WAIT_S,
    interactive_wait: float = INTERACTIVE_WAIT_S,
) -> dict[str, dict[str, int]]:
    """``{model: {"batch": n, "interactive": n}}``: the chart's ``scaling.lagThresholds``."""
    out: dict[str, dict[str, int]] = {}
    for cap in capacities:
        lanes = lane_thresholds(cap, batch_wait, interactive_wait)
        out[cap.model] = {lane.priority.value: lane.lag_threshold for lane in lanes}
    return out


def values_snippet(
    pool: str,
    device: str,
    hardware_class: str,
    pinned: Sequence[str],
    models: Sequence[str],
    capacities: Sequence[ModelCapacity],
    *,
    min_replicas: int,
    max_replicas: int,
    batch_wait: float = BATCH_WAIT_S,
    interactive_wait: float = INTERACTIVE_WAIT_S,
) -> str:
    """The pool as YAML for the chart's ``workerPools``, with how each figure was found."""
    entry = {
        "name": pool,
        "device": device,
        "hardwareClass": hardware_class,
        "pinned": list(pinned),
        "models": list(models),
        "scaling": {
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "lagThresholds": lag_thresholds(capacities, batch_wait, interactive_wait),
        },
    }
    head = [
        f"# lagThreshold = ceil(requests/s per replica x wait): batch {batch_wait:g} s, "
        f"interactive {interactive_wait:g} s",
        *(f"#   {c.model}: {c.rps:.2f} req/s ({c.source})" for c in capacities),
    ]
    body = yaml.safe_dump({"workerPools": [entry]}, sort_keys=False, width=100)
    return "\n".join(head) + "\n" + body


def _rps_overrides(items: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        model, sep, value = item.rpartition("=")
        try:
            out[model] = float(value)
        except ValueError:
            model = ""
        if not sep or not model or out[model] <= 0:
            raise ValueError(f"--rps {item!r}: expected MODEL=REQUESTS_PER_SECOND (> 0)")
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fleetserve.ops.capacity",
        description="Print a worker pool for the Helm chart, its KEDA lag thresholds "
        "derived from the tuned profiles of its models.",
    )
    p.add_argument("--pool", required=True, help="Pool name (a Kubernetes name).")
    p.add_argument("--hardware-class", required=True, help="The pool's class, e.g. cpu-amx.")
    p.add_argument("--device", default="", help="cpu or cuda [from the class].")
    p.add_argument("--pin", action="append", default=[], help="A model loaded at start.")
    p.add_argument("--model", action="append", default=[], help="A model loaded on first use.")
    p.add_argument("--min-replicas", type=int, default=None, help="[0 without pins, else 1]")
    p.add_argument("--max-replicas", type=int, default=4, help="[4]")
    p.add_argument("--batch-wait", type=float, default=BATCH_WAIT_S, help="Seconds [10].")
    p.add_argument("--interactive-wait", type=float, default=INTERACTIVE_WAIT_S, help="[1]")
    p.add_argument("--profile-dir", default="", help="Your tuned profiles, before bundled.")
    p.add_argument("--rps", action="append", default=[], help="MODEL=N: measured elsewhere.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        ids = [*args.pin, *(m for m in args.model if not any(c in m for c in "*?["))]
        if not ids:
            raise ValueError("name at least one model id (--pin or --model) to scale on")
        given = _rps_overrides(args.rps)
        root = Path(args.profile_dir).expanduser() if args.profile_dir else None
        caps = [
            ModelCapacity(m, args.hardware_class, given[m], "given with --rps")
            if m in given
            else model_capacity(m, args.hardware_class, root)
            for m in dict.fromkeys(ids)
        ]
        low = args.min_replicas if args.min_replicas is not None else (1 if args.pin else 0)
        if low == 0 and args.pin:
            raise ValueError("a pool that pins models cannot scale to zero (--min-replicas 0)")
        device = args.device or ("cuda" if args.hardware_class.startswith("cuda") else "cpu")
        text = values_snippet(
            args.pool, device, args.hardware_class, args.pin, args.model, caps,
            min_replicas=low, max_replicas=args.max_replicas,
            batch_wait=args.batch_wait, interactive_wait=args.interactive_wait,
        )  # fmt: skip
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
