"""``python -m benchmarks profiles``: one model on two or more profile directories,
served side by side and sampled in turns (A B, B A, ...), the same client and cores.

What the tuner's windows cannot settle on a noisy machine, servers in turns can: each
round samples every server once, the order reversed each round, so drift falls on
all alike. Prints each server's samples and the ratio of the medians to the first.
For example (MiniLM on cpu-avx2: OpenVINO fp32 against ONNX Runtime fp32)::

    python -m benchmarks profiles --profiles /tmp/ab/ov,/tmp/ab/onnx --clients 4,8
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from .selftune import REAL, _saturate, _Work
from .targets import fleetserve_target


def main(argv: Sequence[str] = ()) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks profiles", description=__doc__)
    p.add_argument("--model", default=REAL)
    p.add_argument("--catalog", default="", help="extra catalog directory (a user's model)")
    p.add_argument("--profiles", required=True, help="comma-separated profile directories")
    p.add_argument("--clients", default="4,8", help="comma-separated concurrencies")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--sample", type=float, default=8.0, help="seconds per sample")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=".bench/results/profiles")
    args = p.parse_args(list(argv))
    from fleetserve.assembly import HF_CACHE
    from fleetserve.bench.tune.workload import mix
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve

    console = Console()
    spec = Catalog.load([Path(args.catalog)] if args.catalog else []).get(args.model)
    texts, lengths = mix(resolve(args.model, spec.sources, HF_CACHE), 512)
    work = _Work(texts, [float(n) for n in lengths], [])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cat = ["--catalog", args.catalog] if args.catalog else []
    dirs = args.profiles.split(",")
    targets = [
        fleetserve_target(args.model, [*cat, "--profile-dir", d, "--tune", "off"], Path(d).name)
        for d in dirs
    ]
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for t in targets:
            t.start(out)
        for clients in (int(c) for c in args.clients.split(",")):
            ns = argparse.Namespace(batch=args.batch, clients=clients, sample=args.sample,
                                    per_item=statistics.mean(lengths))  # fmt: skip
            for t in targets:
                _saturate(t, work, ns)  # warm
            got: dict[str, list[float]] = {t.name: [] for t in targets}
            for i in range(args.rounds):
                for t in targets if i % 2 == 0 else targets[::-1]:
                    got[t.name].append(_saturate(t, work, ns))
            results[str(clients)] = got
            first = statistics.median(got[targets[0].name])
            line = ", ".join(
                f"{n} {statistics.median(v):,.0f} ({statistics.median(v) / first:.3f}x)"
                for n, v in got.items()
            )
            console.print(f"{clients} clients x {args.batch}: {line}")
    finally:
        for t in targets:
            t.stop()
    (out / "profiles.json").write_text(json.dumps(results, indent=1))
    return 0
