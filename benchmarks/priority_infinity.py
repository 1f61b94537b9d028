"""infinity-emb at its best setting on this machine, for ``python -m benchmarks priority``.

The candidates: each ``--dtype`` at the first batch size (as ``python -m benchmarks
embed`` tries them), then the best dtype at the other ``--batch-size`` values. Each is
started alone from its own venv (``benchmarks/infinity_venv.sh``), checked against the
float32 candidate (min cosine over probe texts >= ``QUALITY``: its int8 is near 0.9),
and measured by the bulk-alone phase. The best bulk throughput is kept running.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape

from .targets import HttpTarget, infinity_target

QUALITY = 0.999
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # in target names
VENV_HINT = "build it with benchmarks/infinity_venv.sh"


def venv_ready(venv: Path) -> bool:
    return (venv / "bin" / "infinity_emb").exists()


def candidate(venv: Path, model_path: Path, dtype: str, batch: int, log_dir: Path) -> HttpTarget:
    t = infinity_target(venv.resolve(), model_path.resolve(), dtype)
    t.name = f"infinity-{SHORT.get(dtype, dtype)}-b{batch}"
    t.argv += ["--batch-size", str(batch)]
    t.cwd = log_dir.resolve()  # where it writes its .infinity_cache
    return t


def min_cos(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def search(
    venv: Path,
    model_path: Path,
    dtypes: Sequence[str],
    batches: Sequence[int],
    probe: list[str],
    bulk_tokens_per_s: Callable[[HttpTarget], float],
    log_dir: Path,
    console: Console,
    live: list[HttpTarget],
) -> tuple[HttpTarget | None, list[dict[str, Any]]]:
    """The best candidate, still running (None if none started or passed), and a row
    per candidate. A single candidate is taken without measuring it here. ``live``
    holds the candidates running at any moment (the caller stops what is left)."""
    order = sorted(dtypes, key=lambda d: d != "float32")  # the reference first
    single = len(order) * len(batches) == 1
    ref: np.ndarray[Any, Any] | None = None
    best: HttpTarget | None = None
    best_tps = -1.0
    rows: list[dict[str, Any]] = []

    def trial(dtype: str, batch: int) -> None:
        nonlocal ref, best, best_tps
        t = candidate(venv, model_path, dtype, batch, log_dir)
        row: dict[str, Any] = {"target": t.name, "dtype": dtype, "batch_size": batch}
        rows.append(row)
        live.append(t)
        with console.status(f"starting {t.name}…"):
            try:
                t.start(log_dir)
            except RuntimeError as exc:
                _stop(t, live)
                row["error"] = str(exc)
                console.print(f"  {t.name}: [red]{escape(str(exc))}[/]")
                return
        emb = t.embed(probe)
        if dtype == "float32" and ref is None:
            ref = emb
        row["min_cos"] = None if ref is None else min_cos(emb, ref)
        row["eligible"] = ok = row["min_cos"] is None or row["min_cos"] >= QUALITY
        tps = bulk_tokens_per_s(t) if ok and not single else None
        row["tokens_per_s"] = tps
        if single:
            console.print(f"  {t.name}: the only candidate, taken as it is")
        else:
            cos = "-" if row["min_cos"] is None else f"{row['min_cos']:.5f}"
            shown = "-" if tps is None else f"{tps:,.0f}"
            console.print(f"  {t.name}: bulk alone {shown} tok/s, min cosine {cos}")
        if ok and (single or (tps is not None and tps > best_tps)):
            if best is not None:
                _stop(best, live)
            best, best_tps = t, tps or 0.0
        else:
            _stop(t, live)

    for d in order:
        trial(d, batches[0])
    if best is not None:
        dtype = next(r["dtype"] for r in rows if r["target"] == best.name)
        for b in batches[1:]:
            trial(dtype, b)
    for r in rows:
        r["chosen"] = best is not None and r["target"] == best.name
    return best, rows


def _stop(t: HttpTarget, live: list[HttpTarget]) -> None:
    t.stop()
    live.remove(t)
