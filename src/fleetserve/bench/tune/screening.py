"""Step 1 of a search: each engine's quality gate and first saturation window.

The fp32 torch reference first, then the rules' pick and its neighbours (a precision
the CPU would emulate after every native one); a candidate that fails its gate is
rejected with its figures, one far slower than the reference is cut short
(``tune/slow.py``), and a window never runs past the budget.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from ...catalog.evidence import runs_natively
from ...runtimes import import_runtimes
from ...runtimes.calibration import CALIBRATION
from . import candidates as cands
from .candidates import Candidate
from .harness import Stack
from .options import TuneError
from .points import CANDIDATE_FAILURES, Point, failure, own_guard, quality_line
from .quality import calibration, compare, replies
from .search import Search
from .slow import SLOW_X, SLOWER, WINDOW, TooLong, too_slow, warm_limit, within
from .workload import requests, token_counter


async def screen(s: Search) -> None:
    """Gate and measure each engine, nearest first: the search's first step."""
    first = Candidate("torch", "fp32", s.hw.cores, 1, *s._default_batch())
    pick = s.opts.start or (s.base.runtime or s.spec.runtime, s.base.precision)
    engines = cands.nearest_first(
        cands.engines(s.spec, s.opts.quick, s.kind),
        pick,
        lambda prec: s.kind == "cpu" and not runs_natively(prec, s.hw.features),
    )
    for rt, why in cands.runtimes_for(s.spec, s.kind):
        if why:
            p = s._add(replace(first, runtime=rt, precision="*"))
            p.status, p.reason = "skipped", why
    for rt, prec in engines:
        c = replace(first, runtime=rt, precision=prec)
        p = s._add(c)
        if emulated(s, c.engine, pick):
            p.status, p.reason = (
                "skipped",
                (
                    f"a quick search skips {prec}: this CPU has no native {prec} "
                    "instructions, so it runs emulated (the full search tries it)"
                ),
            )  # and its slow windows would outlast the server's idle spells
            continue
        if s.reference and not s.clock.fits(s._measure_cost_s()):
            p.status, p.reason = "skipped", "the time budget ran out"
            continue
        await gate_and_measure(s, p)
    measured = [q for q in s.points if q.status == "measured"]
    if not measured:
        raise TuneError("no candidate was measured within the budget")
    judged = measured + [q for q in s.points if q.reason.startswith(SLOWER)]
    if len(judged) == 1 and len(engines) > 1:
        raise TuneError(
            "only the fp32 reference was measured within the budget: nothing to choose "
            "between; give it a larger --budget"
        )


def emulated(s: Search, engine: tuple[str, str], pick: tuple[str, str]) -> bool:
    """A quick search's precision that this CPU would emulate (torch fp16 without
    AVX512-FP16 or AMX-FP16), unless it is what the server runs."""
    return (
        s.opts.quick
        and s.kind == "cpu"
        and engine != pick
        and not runs_natively(engine[1], s.hw.features)
    )


async def gate_and_measure(s: Search, p: Point) -> None:
    """``p``'s load, quality set and window. Its runtime's library is imported first,
    outside its load's seconds: an import is paid once per search, and the first
    engine's load (the reference's, torch and transformers imported in it) priced the
    next candidate's load and the final steps' reserve, 3 to 8 s of imports counted three
    times: under load on 2 cores it left a 30 s quick search no room for a second engine."""
    c = p.cand
    p.status = "measuring"
    s._changed()
    await asyncio.to_thread(import_runtimes, [c.runtime])  # (on the clock, not a load)
    t0 = time.monotonic()
    try:
        stack = s._stack(c)
        async with stack:
            p.load_s = time.monotonic() - t0
            actual = stack.family.runtime.precision
            if actual != c.precision:
                p.quality = own_guard(stack.family.runtime)
                p.status = "rejected" if p.quality else "skipped"
                p.reason = f"{c.runtime} ran {actual} when asked for {c.precision}"
                if p.quality:
                    p.reason += f" (its own guard: {quality_line(p.quality)})"
                return
            t_gate = time.monotonic()
            limit = s._gate_limit(c)
            deadline = t_gate + limit if limit is not None else None
            times: list[float] = []  # each calibration request's seconds
            try:  # (the gate itself of an emulated precision can take minutes)
                got = await stack.compute(
                    replies, stack.family, s.spec, calibration(s.spec), deadline, times
                )
            except TimeoutError:
                p.status = "skipped"
                p.reason = (
                    f"{SLOWER} on the quality set (cut at {limit:.1f}s against "
                    f"{s.reference_s:.1f}s): not measured"
                )
                return
            took = time.monotonic() - t_gate
            if not s.reference:
                s.reference = got  # the first engine is the fp32 torch reference
                s.reference_s, s.reference_times = took, times
                if s.opts.quick:
                    quick_requests(s, times)
            p.quality = compare(s.reference, got)
            if not p.quality.passed:
                p.status = "rejected"
                p.reason = f"quality: {quality_line(p.quality)}"
                return
            if s._gate_limit(c) is not None and (
                why := too_slow(
                    took, times, s.reference_times, s.reference_window_s,
                    s.clock.fits,
                )
            ):  # fmt: skip
                p.status, p.reason = "skipped", why
                return
            t_window = time.monotonic()
            if not s.reference_window_s:  # the reference's window, uncapped
                await s._measure(stack, p)
                s.reference_window_s = time.monotonic() - t_window
            elif why := await capped_measure(s, stack, p):
                p.status, p.reason = "skipped", why
                return
    except CANDIDATE_FAILURES as exc:
        p.status, p.reason = "rejected", f"failed: {failure(exc)}"
        if not s.reference:
            raise TuneError(f"the fp32 torch reference failed: {failure(exc)}") from exc
        return
    finally:
        s._changed()
    p.status = "measured"


async def capped_measure(s: Search, stack: Stack, p: Point) -> str:
    """``p``'s window, given SLOW_X times the reference's (on a CPU, but for
    torch.compile) and never past the budget; why it was cut, or ""."""
    left = max(1.0, s.clock.left())
    limited = s._gate_limit(p.cand) is not None
    slow_cap = SLOW_X * s.reference_window_s if limited else left
    warm = warm_limit(s.reference_warm_s) if limited and s.reference_warm_s else None
    try:
        await within(s._measure(stack, p, warm), min(left, slow_cap), s.pauses)
    except TooLong as exc:
        p.samples.clear()
        if exc.what != WINDOW or left >= slow_cap:
            return f"{SLOWER} at saturation: {exc} ({SLOW_X:g}x the reference's): not measured"
        return f"the time budget ran out during its window ({exc.cap:.0f}s)"
    return ""


QUICK_SHARE = 6  # a quick search's window takes at most this share of its budget
# whose calibration requests are CALIBRATION's texts, 8 at a time (tune/quality.py)
CALIBRATED = ("dense", "multivector", "ner", "zero_shot", "span_ner")


def quick_requests(s: Search, times: list[float]) -> None:
    """A quick search of a slow model sends smaller requests, so that one window takes
    about 1/QUICK_SHARE of the budget and the pick fits beside the reference: a 110M
    model on 2 cores took 4.5 s per 32-text request and 64 s per window, more than a
    60 s quick search. The window is priced per token from the reference's quality
    set: two warm requests, then clients x 2 in its warm-up and measurement, and their
    drain."""
    if s.spec.family not in CALIBRATED or not times or not s.requests:
        return
    count = token_counter(s.path, s.spec.max_seq_len)
    per_token = sum(times) / max(1, sum(count(t) for t in CALIBRATION))
    per_item = sum(r.tokens for r in s.requests) / max(1, sum(r.items for r in s.requests))
    batch = s.opts.batch

    def window(b: int) -> float:
        work = (2 + 2 * s.opts.clients) * b * per_item * per_token
        return work + s.opts.measure_s + s.warmup_s

    while batch > 4 and window(batch) > s.opts.budget_s / QUICK_SHARE:
        batch //= 2
    if batch < s.opts.batch:
        s.requests = requests(s.spec, s.path, s.opts.workload, batch)
        s.notes.append(
            f"a quick search of {batch}-item requests: at {per_token * 1e3:.1f} ms per "
            f"token on the reference, a window of {s.opts.batch} would take "
            f"~{window(s.opts.batch):.0f}s of its {s.opts.budget_s:.0f}s"
        )
