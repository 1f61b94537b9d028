"""``fleetserve bench cost``: fit a model's cost coefficients on this machine.

Loads the model with the profile it would serve with here, times its forward pass
over a grid of batch sizes and mixed lengths of real prepared items, and fits
``ms = fixed + per_token * real_tokens + per_padded_token * (max_len * batch)``
(``tune.costfit``, which ``fleetserve tune`` runs for every winner).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console


def main(argv: Sequence[str] = ()) -> int:
    from ..assembly import HF_CACHE, build_profiles
    from ..catalog import Catalog
    from ..catalog.sources import resolve
    from ..families import create_family
    from ..runtimes import create_runtime
    from ..settings import Settings
    from .tune.costfit import fit_times, item_pool, time_shapes
    from .tune.workload import requests

    p = argparse.ArgumentParser(prog="fleetserve bench cost", description=__doc__)
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--catalog", default="")
    p.add_argument("--workload", default="mix", choices=["mix", "sentences"])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(list(argv))
    console = Console()
    spec = Catalog.load([Path(args.catalog)] if args.catalog else []).get(args.model)
    choice = build_profiles(Settings(device=args.device)).choose(spec)
    prof = choice.profile
    path = resolve(spec.id, spec.sources, HF_CACHE)
    runtime = create_runtime(
        prof.runtime or spec.runtime, device=args.device, precision=prof.precision
    )
    adapter = create_family(spec, runtime, path)
    adapter.load()
    pool = item_pool(adapter, spec.id, requests(spec, path, args.workload, 32, 8))
    with console.status("timing forward passes…"):
        shapes, times = time_shapes(
            adapter.forward,
            pool,
            max_batch_size=prof.max_batch_size,
            max_batch_tokens=prof.max_batch_tokens,
            repeats=args.repeats,
        )
    result = fit_times(shapes, times)
    console.print(
        f"{spec.id} on {args.device} ({prof.runtime or spec.runtime} {prof.precision}, "
        f"{choice.how}), {result.points} shapes, median error on held-out shapes "
        f"{result.median_rel_error:.1%}"
    )
    c = result.cost
    console.print(
        f"    cost: {{fixed_ms: {c.fixed_ms:.3f}, per_token_ms: {c.per_token_ms:.5f}, "
        f"per_padded_token_ms: {c.per_padded_token_ms:.5f}}}"
    )
    console.print(json.dumps(result.as_dict()))
    return 0
