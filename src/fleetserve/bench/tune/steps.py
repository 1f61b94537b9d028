"""The steps after the search proper: torch.compile's probe, processes per device, the
knee, the cost fit, the memory footprint, and the choice of the winner."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from ...catalog.rules import EXPORT_FAMILIES
from ...fleet.memory import peak_bytes, reset_peak, rss_bytes
from ..knee_find import KneePoint, find_knee
from ..openloop import auto_rates, capacity, sweep, window_s
from . import candidates as cands
from .activation import measure_activation_peak
from .costfit import CostFit, fit_times, item_pool, time_shapes
from .duel import Duel
from .harness import Stack
from .pauses import Spoiled
from .quality import calibration, compare, replies
from .search import Point, Search, quality_line
from .workload import requests

MAX_BAND = 0.05  # a gain within this (or the measured noise, if smaller) is a tie
COMPILE_PROBE_S = 120.0  # torch.compile's first compile, a recompile and a measurement
KNEE_ITEMS = 4  # items per request in the knee sweep: many small requests, so that a
# few seconds per rate hold enough of them for the rates to be measured closely
KNEE_ARRIVALS = 20  # the fewest requests a rate's window holds: a slow model's low rates
# get longer windows (at 1 request/s, 2.5 s held 0-3 arrivals: offered rates of 0.0)


async def threads(s: Search) -> None:
    """The best point again with more processes and fewer threads each."""
    s.phase = "threads"
    best = s.best()
    most = s.opts.max_processes or s.hw.cores
    for t, procs in [x for x in cands.thread_layouts(s.hw)[1:] if x[1] <= most]:
        q = s._add(best.cand.with_threads(t, procs), like=best)
        if s.kind != "cpu":
            q.status, q.reason = "skipped", "processes per device are tuned on CPUs only"
        elif not s.clock.fits(s._measure_cost_s() * 1.5):
            q.status, q.reason = "skipped", "the time budget ran out"
        else:
            await s._run_point(q)


async def compile_probe(s: Search) -> None:
    """``torch.compile`` at the best eager torch precision, where it may pay: it
    is kept only if a batch shape it has not seen costs less than a second more
    than one it has (a server sees new shapes all the time)."""
    eager = [p for p in s.measured() if p.cand.runtime == "torch"]
    if s.opts.quick or not eager or s.spec.family not in EXPORT_FAMILIES:
        return
    p = s._add(replace(eager[0].cand, runtime="torch_compile"))
    if not s.clock.fits(COMPILE_PROBE_S):
        p.status, p.reason = "skipped", "the time budget ran out (compiling takes a while)"
        return
    p.status = "measuring"
    s._changed()
    t0 = time.monotonic()
    try:
        async with s._stack(p.cand) as stack:  # the warm-up compiles
            p.load_s = time.monotonic() - t0

            async def shapes() -> list[float]:  # a shape it compiled for, then a new one
                times = []
                for req in (s.requests[0], s.requests[0], s.requests[1]):
                    t1 = time.monotonic()
                    await stack.send(req)
                    times.append(time.monotonic() - t1)
                return times

            times = await s.unspoiled(shapes)
            new, seen = max(times[0], times[2]), times[1]
            if new > seen + 1.0:
                p.status = "rejected"
                p.reason = (
                    f"does not pay: compiling took {p.load_s:.0f}s, and a request with "
                    f"batch shapes it had not seen {new:.1f}s against {seen * 1e3:.0f} ms "
                    "once compiled"
                )
                return
            got = await stack.compute(replies, stack.family, s.spec, calibration(s.spec))
            p.quality = compare(s.reference, got)  # its own gate: compiled kernels differ
            if not p.quality.passed:
                p.status, p.reason = "rejected", f"quality: {quality_line(p.quality)}"
                return
            await s._measure(stack, p)
            p.status = "measured"
    except Exception as exc:  # inductor fails in many ways (no compiler, no Triton...)
        p.status, p.reason = "rejected", f"failed: {type(exc).__name__}: {exc}"[:300]
    finally:
        s._changed()


def choose(s: Search, duel: Duel | None = None) -> Point:
    """The leader of a decided ``duel`` wins (see :mod:`.duel`); else the highest
    median throughput. Within the noise of it (capped at :data:`MAX_BAND`), the
    simpler point wins: fewer processes, then a smaller batch (less waiting per
    request).

    A background tune (``--start``: the engine the server runs) keeps that engine
    where its best point is within the noise of the best, uncapped: a swap needs a
    gain beyond the noise anyway, and the winner is what gets the cost fit, so the
    running engine then gets its own fitted figures instead of a noisy swap. (The
    MiniLM sentences run on cpu-avx2: a quick search's torch fp32, +9.3 % within 11.8 %
    noise of OpenVINO fp32, was swapped in and served 3,700-4,600 tokens/s where
    OpenVINO had served 4,300-4,900, its query p50 twice OpenVINO's.)"""
    ranked = s.measured()
    if not ranked:
        raise RuntimeError("nothing was measured")
    band = min(s.noise, MAX_BAND)
    close = [p for p in ranked if p.tokens_per_s >= (1 - band) * ranked[0].tokens_per_s]
    lead = duel.leader() if duel is not None else None
    led = next((p for p in ranked if p.cand.id == lead), None)
    runs = [p for p in ranked if p.cand.engine == s.opts.start] if s.opts.start else []
    kept = bool(not led and runs and runs[0].tokens_per_s >= (1 - s.noise) * ranked[0].tokens_per_s)
    if kept:
        close = [p for p in runs if p.tokens_per_s >= (1 - band) * runs[0].tokens_per_s]
    winner = led or min(close, key=lambda p: (p.cand.processes, p.cand.max_batch_size))
    for p in s.points:
        if p is winner:
            p.status, p.reason = "won", ""
        elif p.status == "measured":
            p.status = "lost"
            p.reason = _lost(p, winner, band, duel if led else None, s.noise if kept else None)
    s.winner = winner
    return winner


def _lost(
    p: Point, w: Point, band: float, duel: Duel | None = None, kept: float | None = None
) -> str:
    """Why ``p`` lost to ``w``; ``kept``: the noise within which the running engine
    was kept."""
    ratio = p.tokens_per_s / w.tokens_per_s if w.tokens_per_s else 0.0
    if duel is not None and p.cand.id in (duel.a, duel.b):
        assert duel.ratio is not None
        r = duel.ratio if p.cand.id == duel.b else 1 / duel.ratio
        return f"{r:.2f}x the winner over {duel.rounds} rounds in turns (a duel)"
    if kept is not None and ratio > 1 and p.cand.engine != w.cand.engine:
        return (f"{ratio:.2f}x the winner, within the noise ({kept:.0%}) of the engine the "
                "server runs, which is kept")  # fmt: skip
    if ratio >= 1 - band:
        if w.cand.processes < p.cand.processes:
            why = "the winner has fewer processes"
        elif w.cand.max_batch_size < p.cand.max_batch_size:
            why = "the winner has a smaller batch"
        else:  # as simple as the winner: the higher median decided
            why = "as simple as the winner, whose median was higher"
        return f"{ratio:.2f}x the winner: within the noise ({band:.0%}), and {why}"
    return f"{ratio:.2f}x the winner's throughput"


async def knee(s: Search, stack: Stack, p: Point, rates_n: int = 8) -> dict[str, Any]:
    """An open-loop sweep of ``p``: Poisson arrivals of small requests at rates around
    its capacity, as ``fleetserve bench knee`` sends them, through the same in-process
    path. The document is ``p.knee`` and updates as points come in."""
    s.phase = "knee"
    reqs = requests(s.spec, s.path, s.opts.workload, KNEE_ITEMS, n=64)

    async def send(i: int) -> int:
        return await stack.send(reqs[i % len(reqs)])

    points: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"slo_ms": s.opts.slo_ms, "points": points, "capacity_rps": None,
                           "items_per_request": KNEE_ITEMS}  # fmt: skip
    p.knee = doc

    def on_point(rate: float, kp: KneePoint) -> None:
        points.append(kp.as_dict())
        s._changed()

    try:
        cap = doc["capacity_rps"] = await s.unspoiled(
            lambda: capacity(send, min(2.0, s.opts.knee_s), concurrency=s.opts.clients)
        )
        s._changed()
        rates = auto_rates(cap, rates_n, low=0.3, high=1.4)
        need = sum(window_s(r, s.opts.knee_s, KNEE_ARRIVALS) + 0.3 for r in rates)
        if not s.clock.fits(need, final=True):  # a slow model: too few arrivals to measure
            why = (
                f"no knee: at {cap:.2g} requests/s its sweep needs {need:.0f}s for "
                f"{KNEE_ARRIVALS} arrivals per rate; {max(0.0, s.clock.left(final=True)):.0f}s "
                "of the budget is left"
            )
            doc.update(knee_rps=None, kneedle_rps=None, knee_tokens_s=None, reason=why)
            s._changed()
            return doc
        got = await sweep(
            send, rates, s.opts.knee_s, stop_after=2, on_point=on_point, drain_s=5.0,
            window=s.unspoiled, min_arrivals=KNEE_ARRIVALS,
        )  # fmt: skip
    except Spoiled as exc:  # a busy server: no knee rather than a spoiled one
        doc.update(knee_rps=None, kneedle_rps=None, knee_tokens_s=None, reason=str(exc))
        s._changed()
        return doc
    k = find_knee(got, s.opts.slo_ms)
    doc.update(knee_rps=k.knee_rps, kneedle_rps=k.kneedle_rps, reason=k.reason)
    doc["knee_tokens_s"] = k.point.achieved_tokens_s if k.point else None
    s._changed()
    return doc


async def knees(s: Search) -> None:
    """The knee of the best point of every other engine that passed its gate, best
    first, while the budget lasts (the winner's is measured first, by the tuner)."""
    seen = {s.winner.cand.engine} if s.winner else set()
    for p in s.measured():
        if p.cand.engine in seen or p.cand.processes > 1:
            continue
        seen.add(p.cand.engine)
        if not s.clock.fits(6 * (s.opts.knee_s + 0.3) + 2.0 + p.load_s, final=True):
            p.reason += "; knee: skipped, the time budget ran out"
            continue
        async with s._stack(p.cand) as stack:
            await knee(s, stack, p, rates_n=6)


async def activation_peak(s: Search, stack: Stack) -> None:
    """The winner's activation peak at its full batch budget, as a server's load
    measures it (``activation.measure_activation_peak``), right after its stack loads:
    before the knee's and the cost fit's batches have grown the process. Read only
    around the fit, after the knee, it came out at 0.1 to 31 MB for every bundled
    encoder profile, where splade-tiny's full batch takes 180 to 350 MiB.
    ``cost_and_memory`` keeps the larger of the two."""
    w = s.winner
    if w is None or s.spec.family == "generate":  # (its figure is its prefill's, at load)
        return
    s.activation = await stack.compute(
        measure_activation_peak, stack.family, s.spec, s.path,
        w.cand.max_batch_tokens, w.cand.max_batch_size,
    )  # fmt: skip


async def cost_and_memory(s: Search, stack: Stack) -> None:
    """Fit the winner's cost model on its own prepared items; measure its footprint
    (the activation peak: the larger of the fit's and ``activation_peak``'s)."""
    s.phase = "cost"
    s._changed()
    adapter = stack.family
    if s.spec.family == "generate":
        return  # generation's cost is per decode step, not per padded batch
    pool = await stack.compute(item_pool, adapter, s.spec.id, s.requests[:8])
    w = s.winner
    assert w is not None
    before = rss_bytes()
    reset_peak()

    # it looks at its deadline between batches: the last may take a full batch's time
    last = 1.0 + w.cand.max_batch_tokens / max(w.tokens_per_s, 1.0)

    def fitting() -> Awaitable[CostFit]:  # its batches are timed: a pause spoils them
        return stack.compute(
            lambda: fit_times(
                *time_shapes(
                    adapter.forward,
                    pool,
                    max_batch_size=w.cand.max_batch_size,
                    max_batch_tokens=w.cand.max_batch_tokens,
                    deadline=time.monotonic() + max(3.0, s.opts.budget_s - s.clock.elapsed - last),
                )
            )
        )

    try:
        fitted = await s.unspoiled(fitting)
    except (ValueError, Spoiled) as exc:
        s.cost_fit = {"error": str(exc)}
        return
    peak = max(0, peak_bytes() - before, s.activation)
    s.cost_fit = fitted.as_dict()
    s.memory = {"weights_bytes": adapter.memory_bytes(), "activation_peak_bytes": peak}
