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
2. for a generation model, the completion tokens/s ``fleetserve tune`` measured through
   the real path (``figures.tokens_per_s``: prefill and every decode step, sequences
   batched as served) divided by the tokens a request generates (the spec's default
   ``max_tokens``, or ``--output-tokens``): its cost model prices one prefill pass, and
   the decode steps that dominate a generation are not in it;
3. otherwise the fitted cost model: a full batch (``max_batch_size`` requests of
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

from ..catalog import Catalog, ModelSpec
from ..catalog.profiles import ProfileFile, bundled_dir, profile_path, read_profile_file
from ..catalog.rules import fallback_chain
from ..wire import Priority
from ..wire.headers import subject_token

BATCH_WAIT_S = 10.0  # a batch backlog one replica clears in this long is on target
INTERACTIVE_WAIT_S = 1.0  # interactive work should wait about a second at most
# what a generation request without max_tokens gets: families.generate.family's default
DEFAULT_MAX_TOKENS = 512


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
    """The durable consumer of a lane, as the worker names it (``queue.js_consumers``)."""
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
    model: str,
    hardware_class: str,
    profile_dir: Path | None = None,
    *,
    catalog: Catalog | None = None,
    output_tokens: int | None = None,
) -> ModelCapacity:
    """Requests/s one replica serves of ``model``: the tuned knee, else (generation) the
    measured tokens/s over the tokens a request generates, else the cost model.

    ``catalog`` (the bundled one by default) says whether the model generates;
    ``output_tokens`` is what a generation request is expected to produce. A
    ``ValueError`` when nothing was tuned for the class or its fallbacks: a threshold
    guessed from rules would scale on a number nobody measured.
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
    specs = catalog if catalog is not None else Catalog.load()
    if model not in specs:
        raise ValueError(
            f"{model}: its profile has no knee_rps and its spec is not in the catalog, so "
            f"whether it generates (and spends its time decoding) is unknown: give "
            f"--catalog DIR with its spec, or --rps {model}=N"
        )
    spec = specs.get(model)
    if spec.family == "generate":
        return _generation_capacity(pf, spec, figures, output_tokens)
    p = pf.profile
    max_len = max(1, p.max_batch_tokens // max(1, p.max_batch_size))
    ms = p.cost.predict_ms(p.max_batch_tokens, max_len, p.max_batch_size)
    rps = p.max_batch_size / max(ms, 1e-3) * 1e3
    source = f"cost model, {pf.hardware_class} {date}: {p.max_batch_size} per {ms:.1f} ms"
    return ModelCapacity(model, pf.hardware_class, rps, source)


def _generation_capacity(
    pf: ProfileFile, spec: ModelSpec, figures: dict[str, object], output_tokens: int | None
) -> ModelCapacity:
    """A generation replica: completion tokens/s measured as served, per request's tokens."""
    tps = figures.get("tokens_per_s")
    if not isinstance(tps, int | float) or not math.isfinite(tps) or tps <= 0:
        raise ValueError(
            f"{spec.id} generates, and its profile for {pf.hardware_class} has neither "
            f"knee_rps nor a measured tokens_per_s; its cost model prices one prefill, not "
            f"the decode steps that take most of a generation: give --rps {spec.id}=N"
        )
    default = int(spec.options.get("max_tokens", DEFAULT_MAX_TOKENS))
    n = output_tokens or max(1, min(default, spec.max_seq_len))
    how = "--output-tokens" if output_tokens else "the default max_tokens"
    source = (
        f"generation, {pf.hardware_class} {pf.provenance.get('date', '?')}: "
        f"{tps:g} completion tokens/s / {n} tokens per request ({how})"
    )
    return ModelCapacity(spec.id, pf.hardware_class, float(tps) / n, source)


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


def _per_model(flag: str, items: Sequence[str], what: str, integer: bool) -> dict[str, float]:
    """``MODEL=N`` flags: N a finite number above 0 (a whole one where ``integer``)."""
    out: dict[str, float] = {}
    for item in items:
        model, sep, value = item.rpartition("=")
        try:
            number = float(int(value)) if integer else float(value)
        except ValueError:
            number = math.nan
        if not sep or not model or not math.isfinite(number) or number <= 0:
            raise ValueError(f"{flag} {item!r}: expected MODEL={what} (a finite number > 0)")
        out[model] = number
    return out


def _positive(flag: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{flag} {value}: expected seconds (a finite number > 0)")
    return value


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
    p.add_argument(
        "--output-tokens",
        action="append",
        default=[],
        help="MODEL=N: tokens a generation request produces [its spec's max_tokens].",
    )
    p.add_argument("--catalog", action="append", default=[], help="A directory of your specs.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        ids = [*args.pin, *(m for m in args.model if not any(c in m for c in "*?["))]
        if not ids:
            raise ValueError("name at least one model id (--pin or --model) to scale on")
        given = _per_model("--rps", args.rps, "REQUESTS_PER_SECOND", integer=False)
        tokens = _per_model("--output-tokens", args.output_tokens, "TOKENS", integer=True)
        _positive("--batch-wait", args.batch_wait)
        _positive("--interactive-wait", args.interactive_wait)
        root = Path(args.profile_dir).expanduser() if args.profile_dir else None
        catalog = Catalog.load([Path(d) for d in args.catalog])
        caps = [
            ModelCapacity(m, args.hardware_class, given[m], "given with --rps")
            if m in given
            else model_capacity(
                m, args.hardware_class, root, catalog=catalog, output_tokens=_int(tokens.get(m))
            )
            for m in dict.fromkeys(ids)
        ]
        low = args.min_replicas if args.min_replicas is not None else (1 if args.pin else 0)
        if low == 0 and args.pin:
            raise ValueError("a pool that pins models cannot scale to zero (--min-replicas 0)")
        if low < 0 or args.max_replicas < max(1, low):
            raise ValueError(
                f"--min-replicas {low} / --max-replicas {args.max_replicas}: expected "
                f"0 <= min <= max and max >= 1"
            )
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


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
