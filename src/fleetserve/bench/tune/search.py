"""The tuning loop: prune by quality, screen, refine the batch budget, settle threads,
find the knee, fit the cost model. Every step fits a time budget.

1. **quality + screen**: each (runtime, precision) is loaded in a :class:`Stack` with
   the default batch budget, judged by the family's gate against the fp32 torch
   reference, and, if it passes, measured at saturation.
2. **batch**: the engines within the noise of the best go through a coarse grid of
   batch budgets, then one finer step around the best of each.
3. **noise**: the two best points are measured again, in interleaved rounds; the
   robust spread of repeats is the noise (see :mod:`.noise`), and a gain within it is
   no gain. Every measurement records the CPU steal of its window (:mod:`.steal`).
4. **threads**: processes per device (with fewer threads each) for the winner.
5. **knee**: an open-loop sweep of the winner through the same path.
6. **cost**: the winner's cost model, fitted on its own forward passes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from ...catalog import ModelSpec
from ...catalog.hardware import Hardware
from ...catalog.rules import rule_profile
from ...families import AnyFamily, create_family
from ...lora.bases import IN_GRAPH, SLOT_RUNTIMES
from ...runtimes import create_runtime
from . import candidates as cands
from . import pauses as pauses_mod
from . import steal as steal_mod
from .candidates import Candidate
from .harness import Measure, Request, Stack, saturate
from .options import ADAPTER_S, Clock, Options, TuneError, min_budget_s, warmup_s
from .points import CANDIDATE_FAILURES, Point, failure, own_guard, quality_line
from .procs import measure_processes
from .slow import gate_limit

T = TypeVar("T")


class Search:
    """One model's search. ``on_change`` is called whenever a point changes."""

    def __init__(
        self,
        spec: ModelSpec,
        path: Path,
        hw: Hardware,
        hardware_class: str,
        opts: Options,
        on_change: Callable[[str], None] = lambda phase: None,
        catalog_dirs: tuple[Path, ...] = (),
    ) -> None:
        self.opts = opts
        self.points: list[Point] = []
        self.notes: list[str] = []  # for the run document
        need = min_budget_s(opts.measure_s) + self.final_s()
        if opts.budget_s < need:
            raise TuneError(
                f"--budget {opts.budget_s:g}s is too small to measure anything: it needs at "
                f"least {need:.0f}s (the fp32 reference, a gate and a measurement of another "
                "candidate, then the winner's knee and cost fit)"
            )
        if spec.runtime == "external":
            raise TuneError(f"{spec.id} runs on an external server: tune that server instead")
        self.spec, self.path, self.hw, self.cls, self.opts = spec, path, hw, hardware_class, opts
        self.kind = "cuda" if hardware_class.startswith("cuda") else "cpu"
        self.base, _ = rule_profile(spec, hw, hardware_class)
        self.pauses = pauses_mod.reader(opts.pause_file)
        self.clock = Clock(opts.budget_s, self.final_s(), self.pauses)  # restarted by start()
        self.noise = 0.0
        self.noise_repeats = self.noise_points = 0  # what the noise was computed from
        self.noise_range = 0.0  # the old (max - min) / median, for comparison
        self.cpu: steal_mod.CpuTimes | None = steal_mod.CpuTimes(0, 0)  # measured windows
        self.phase = "quality"
        self.on_change = on_change
        self.requests: list[Request] = []
        self.reference: list[object] = []
        self.reference_s = 0.0  # how long the reference took on the quality set
        self.reference_times: list[float] = []  # ... each of its requests
        self.reference_window_s = 0.0  # how long its saturation window ran (wall)
        self.reference_warm_s = 0.0  # ... and its two warm requests
        self.cost_fit: dict[str, Any] | None = None
        self.winner: Point | None = None
        self.memory: dict[str, int] | None = None
        self.activation = 0  # the winner's activation peak before any traffic (steps)
        self.adapters = ""  # where the winner's adapters run (``adapter_path``)
        self.adapter_quality: dict[str, Any] | None = None  # ... the slot gate's figure
        self.catalog_dirs = catalog_dirs

    def start(self) -> None:
        """Start the budget's clock: when this model's search begins, not before."""
        self.clock = Clock(self.opts.budget_s, self.final_s(), self.pauses)

    def final_s(self) -> float:
        """What the final steps need: the winner's load (8 s holds a small one and the
        cost fit; more for a slower load of a point within 10 % of the best so far, the
        likely winners), its knee sweep and cost fit, and where a likely winner's
        adapters could run in its graph, their gate (``adapter_path``)."""
        ranked = [p for p in self.points if p.samples]
        best = max((p.tokens_per_s for p in ranked), default=0.0)
        likely = [p for p in ranked if p.tokens_per_s >= 0.9 * best]
        load = max((p.load_s for p in likely), default=0.0)
        knee = 0.0 if self.opts.quick else self.knee_cost_s()  # (a quick one's: if time is left)
        slots = any(p.cand.runtime in SLOT_RUNTIMES for p in likely)  # (none yet at init)
        slots = slots and self.spec.family in IN_GRAPH
        return knee + 8.0 + max(0.0, load - 3.0) + (ADAPTER_S if slots else 0.0)

    def knee_cost_s(self) -> float:
        """The winner's knee sweep, once it is loaded."""
        return self.knee_rates * (self.opts.knee_s + 0.3) + 2.0 if self.opts.knee else 0.0

    @property
    def knee_rates(self) -> int:
        return 6 if self.opts.quick else 8

    # -- building blocks ----------------------------------------------------------------
    def family_of(self, c: Candidate, adapter_slots: int = 0, max_rank: int = 64) -> AnyFamily:
        """Candidate ``c``'s family, not loaded (``adapter_slots``: LoRA slots in its
        graph, where its runtime has them)."""
        threads = c.threads if self.kind == "cpu" else 0
        runtime = create_runtime(
            c.runtime,
            device=self.opts.device,
            precision=c.precision,
            threads=threads,
            cache_dir=self.opts.cache_dir,
            options=self.spec.runtime_options,
            adapter_slots=adapter_slots,
            max_rank=max_rank,
        )
        return create_family(self.spec, runtime, self.path)

    def _stack(self, c: Candidate) -> Stack:
        return Stack(self.spec, c.profile(self.cls, self.base), self.family_of(c))

    def _changed(self) -> None:
        self.on_change(self.phase)

    @property
    def knee(self) -> dict[str, object] | None:
        """The winner's knee (the run document's ``knee``)."""
        return self.winner.knee if self.winner else None

    async def unspoiled(self, measure: Callable[[], Awaitable[T]]) -> T:
        """``measure()`` in a window no pause of a background tune cut into."""
        return await pauses_mod.unspoiled(self.pauses, self.clock, measure)

    def _add(self, c: Candidate, like: Point | None = None) -> Point:
        """A new point; ``like``: the point it varies (same engine, so same quality)."""
        p = Point(c, quality=like.quality if like else None)
        self.points.append(p)
        return p

    async def _measure(self, stack: Stack, p: Point, warm_limit: float | None = None) -> None:
        p.status = "measuring"
        self._changed()
        before = steal_mod.read()

        # a pause of a background tune's server leaves the window (see saturate): no
        # window is measured again, however often light traffic cuts into them
        m = await saturate(
            stack, self.requests, self.opts.clients, self.opts.measure_s, self.warmup_s,
            self.pauses, warm_limit,
        )  # fmt: skip
        if m.requests == 0:
            raise TuneError(f"{p.cand.id}: every request failed ({m.errors} errors)")
        self.reference_warm_s = self.reference_warm_s or m.warm_s  # (the first window's)
        self._record(p, m, before)

    def _record(self, p: Point, m: Measure, before: steal_mod.CpuTimes | None) -> None:
        """``m`` as ``p``'s next sample, with the CPU steal since ``before``."""
        d = steal_mod.window(before, steal_mod.read())
        self.cpu = self.cpu + d if self.cpu is not None and d is not None else None
        p.samples.append(m.tokens_per_s)
        p.steal.append(d.fraction if d is not None else None)
        p.items_per_s, p.p50_ms, p.p99_ms = m.items_per_s, m.p50_ms, m.p99_ms
        self.clock.reserve_s = self.final_s()  # (a likely winner's slow load: kept back)

    @property
    def steal(self) -> float | None:
        """CPU steal over every measured window so far; ``None`` if unknown."""
        return self.cpu.fraction if self.cpu is not None else None

    @property
    def warmup_s(self) -> float:
        return warmup_s(self.opts.measure_s)

    def _measure_cost_s(self) -> float:
        load = max((p.load_s for p in self.points), default=5.0)
        return self.opts.measure_s + self.warmup_s + load + 1.0

    # -- 1. quality gate and screening: tune/screening.py, over this search -------------
    def _gate_limit(self, c: Candidate) -> float | None:
        return gate_limit(self.kind, c.runtime, self.reference_s)

    def _default_batch(self) -> tuple[int, int]:
        return self.base.max_batch_tokens, self.base.max_batch_size

    # -- 2. batch budgets ---------------------------------------------------------------
    def measured(self) -> list[Point]:
        return sorted(
            (p for p in self.points if p.status in ("measured", "lost", "won")),
            key=lambda p: -p.tokens_per_s,
        )

    def best(self) -> Point:
        """The fastest point still standing; a TuneError where a later measurement
        failed every one (an interrupted noise round, a runtime that broke)."""
        ranked = self.measured()
        if not ranked:
            why = next((p.reason for p in reversed(self.points) if p.status == "rejected"), "")
            raise TuneError(f"no candidate is left measured ({why or 'none passed'})")
        return ranked[0]

    async def batches(self) -> None:
        """The engines within the noise of the best, over the coarse grid, then one
        finer step around each one's best, if the grid's best beat the default by
        more than the noise."""
        self.phase = "batch"
        best = self.best().tokens_per_s
        margin = max(0.03, 2 * self.noise)
        top = [p for p in self.measured() if p.tokens_per_s >= (1 - margin) * best][:2]
        grid = cands.batch_grid(self.spec.family, self.kind)
        if self.opts.quick:
            grid = grid[1:3]
        for p in top:
            tried = {(p.cand.max_batch_tokens, p.cand.max_batch_size): p}
            for t, s in grid:
                await self._try_batch(p, t, s, tried)
            ranked = sorted(tried.values(), key=lambda q: -q.tokens_per_s)
            b = ranked[0].cand
            gain = ranked[0].tokens_per_s / max(p.tokens_per_s, 1e-9) - 1
            if not self.opts.quick and gain > self.noise:
                for t, s in cands.refine(grid, (b.max_batch_tokens, b.max_batch_size)):
                    await self._try_batch(p, t, s, tried)

    async def _try_batch(
        self, p: Point, tokens: int, size: int, tried: dict[tuple[int, int], Point]
    ) -> None:
        if (tokens, size) in tried:
            return
        q = self._add(p.cand.with_batch(tokens, size), like=p)
        tried[tokens, size] = q
        if not self.clock.fits(self._measure_cost_s()):
            q.status, q.reason = "skipped", "the time budget ran out"
            return
        await self._run_point(q)

    async def _run_point(self, q: Point) -> None:
        """Measure ``q`` once more: in this process, or in its processes per device."""
        t0 = time.monotonic()
        try:
            if q.cand.processes > 1:
                q.status = "measuring"
                self._changed()
                before = steal_mod.read()  # (includes the children's loads: an upper bound)
                self._record(q, await measure_processes(self, q.cand), before)
            else:
                async with self._stack(q.cand) as stack:
                    q.load_s = time.monotonic() - t0
                    await self._measure(stack, q)
            q.status = "measured"
        except CANDIDATE_FAILURES as exc:
            q.status, q.reason = "rejected", f"failed: {failure(exc)}"
        self._changed()


# Options, Clock, Point and the reasons' lines live in .options and .points; they are
# named here too, where the tune's callers have always imported them
__all__ = [
    "CANDIDATE_FAILURES",
    "Clock",
    "Options",
    "Point",
    "Search",
    "TuneError",
    "own_guard",
    "quality_line",
]
