"""Tuning runs on disk: one JSON document per run, rewritten atomically as it goes.

The tuner writes them; the dashboard (``/dashboard``) and ``GET /v1/tuning/runs`` read
them. A run document (``RUN_VERSION`` 1) holds::

    id, model, family, hardware_class, machine, status, phase,
    started_at, updated_at, finished_at,   # ISO-8601 UTC; finished_at null while running
    budget_s, elapsed_s,
    noise,                                 # relative spread of repeated measurements
    noise_method, noise_repeats, noise_points,  # how: see tune.noise
    noise_range,                           # (max - min) / median of the same, for comparison
    steal,                                 # CPU steal / CPU time while measuring; null: unknown
    candidates: [Candidate],               # every point tried, in the order tried
    winner,                                # a candidate id, once chosen
    knee: {slo_ms, points: [KneePoint], knee_rps, kneedle_rps} | null,
    profile: {...} | null,                 # the profile written, as in its YAML
    cost_fit: {fixed_ms, per_token_ms, per_padded_token_ms, median_rel_error} | null,
    report: {markdown, json, png} | null,  # paths of the written report
    error: str | null

``status`` is ``running``, ``succeeded``, ``failed`` or ``cancelled``; ``phase`` names
the step in progress (``quality``, ``screen``, ``batch``, ``threads``, ``knee``,
``done``). A Candidate is::

    id, runtime, precision, threads, processes, max_batch_tokens, max_batch_size,
    status,        # pending, measuring, rejected (quality), lost, won, skipped
    quality: {metric, value, threshold, passed, detail} | null,
    tokens_per_s, items_per_s, p50_ms, p99_ms, samples: [tokens_per_s...],
    steal: [fraction | null...],  # each sample's CPU steal (see tune.steal)
    reason         # why it was rejected, skipped or lost; "" for the winner

A KneePoint is ``{offered_rps, achieved_rps, offered_tokens_s, achieved_tokens_s,
p50_ms, p99_ms, errors}``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

RUN_VERSION = 1
STATUSES = ("running", "succeeded", "failed", "cancelled")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(model: str, hardware_class: str) -> str:
    """Sortable by start time, readable, and safe as a file name."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    slug = _SAFE.sub("-", model.rsplit("/", 1)[-1]).strip("-").lower()
    return f"{stamp}-{slug}-{hardware_class}-{uuid.uuid4().hex[:6]}"


class RunStore:
    """Run documents in ``root`` as ``<id>.json``. Writes are atomic (rename), so a
    reader never sees half a document."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser()

    def path(self, run_id: str) -> Path:
        if not run_id or _SAFE.search(run_id) or run_id.startswith("."):
            raise KeyError(run_id)
        return self.root / f"{run_id}.json"

    def write(self, run: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        run["updated_at"] = now_iso()
        file = self.path(str(run["id"]))
        tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps(run, indent=1, default=_plain))
        os.replace(tmp, file)

    def get(self, run_id: str) -> dict[str, Any]:
        """The run, or ``KeyError``. A file that does not parse is treated as absent."""
        try:
            data = json.loads(self.path(run_id).read_text())
        except (OSError, ValueError):
            raise KeyError(run_id) from None
        if not isinstance(data, dict):
            raise KeyError(run_id)
        return data

    def list(self) -> list[dict[str, Any]]:
        """Every readable run, newest first."""
        out = []
        if self.root.is_dir():
            for f in self.root.glob("*.json"):
                try:
                    data = json.loads(f.read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(data, dict) and "id" in data:
                    out.append(data)
        out.sort(key=lambda r: str(r.get("started_at", "")), reverse=True)
        return out

    def mtime(self) -> float:
        """The newest change in the store (for cheap change detection), 0 if empty."""
        if not self.root.is_dir():
            return 0.0
        return max((f.stat().st_mtime for f in self.root.glob("*.json")), default=0.0)


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """The fields a list of runs shows."""
    keys = ("id", "model", "family", "hardware_class", "status", "phase", "started_at")
    out = {k: run.get(k) for k in keys}
    out["updated_at"] = run.get("updated_at")
    out["winner"] = run.get("winner")
    out["candidates"] = len(run.get("candidates") or [])
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    raise TypeError(f"not JSON-serializable: {type(v).__name__}")


__all__ = ["RUN_VERSION", "STATUSES", "RunStore", "new_run_id", "now_iso", "summary"]
