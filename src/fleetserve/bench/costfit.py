"""``fleetserve bench cost``: fit a model's cost coefficients on this machine.

Times the forward pass over a grid of batch sizes and mixed sequence lengths, then
fits ``ms = fixed + per_token * real_tokens + per_padded_token * (max_len * batch)``
by least squares and prints the profile's ``cost:`` line.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console


def main(argv: Sequence[str] = ()) -> int:
    from ..catalog import Catalog, CostModel
    from ..catalog.sources import resolve
    from ..families.dense import DenseAdapter
    from ..runtimes import create_runtime, hardware_class
    from ..server import HF_CACHE

    p = argparse.ArgumentParser(prog="fleetserve bench cost", description=__doc__)
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--catalog", default="")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(list(argv))
    console = Console()
    spec = Catalog.load([Path(args.catalog)] if args.catalog else []).get(args.model)
    profile = spec.profile(hardware_class(args.device))
    runtime = create_runtime(spec.runtime, device=args.device, precision=profile.precision)
    adapter = DenseAdapter(spec, runtime, resolve(spec.id, spec.sources, HF_CACHE))
    adapter.load()
    rng = random.Random(0)
    shapes: list[tuple[int, int, int]] = []  # real tokens, max length, batch size
    xs: list[float] = []
    with console.status("timing forward passes…"):
        for batch in (1, 4, 8, 16, 32):
            for short, long in ((8, 8), (16, 64), (32, 32), (8, 128), (64, 64), (32, 128)):
                items = [
                    [101]
                    + [rng.randrange(1000, 20000) for _ in range((short if i % 2 else long) - 2)]
                    + [102]
                    for i in range(batch)
                ]
                adapter.forward(items)
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    adapter.forward(items)
                    times.append((time.perf_counter() - t0) * 1e3)
                shapes.append((sum(len(x) for x in items), max(len(x) for x in items), batch))
                xs.append(statistics.median(times))
    a = np.asarray([(1.0, t, m * b) for t, m, b in shapes], dtype=np.float64)
    coef, *_ = np.linalg.lstsq(a, np.asarray(xs), rcond=None)
    fixed, per_token, per_padded = (max(float(c), 0.0) for c in coef)
    # judge the fit with the profile's own formula (CostModel.predict_ms)
    model = CostModel(fixed, per_token, per_padded)
    pred = np.asarray([model.predict_ms(t, m, b) for t, m, b in shapes])
    err = float(np.median(np.abs(pred - xs) / np.asarray(xs)))
    console.print(
        f"{spec.id} on {args.device} ({profile.precision}), {len(xs)} points, "
        f"median relative error {err:.1%}"
    )
    console.print(
        f"    cost: {{fixed_ms: {fixed:.3f}, per_token_ms: {per_token:.5f}, "
        f"per_padded_token_ms: {per_padded:.5f}}}"
    )
    return 0
