"""The search's own decisions, on points made up here: the budget's clock, the winner
within the noise, the batch grid's refinement, and budgets too small to use."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetserve.bench.tune import candidates as cands
from fleetserve.bench.tune import screening, slow
from fleetserve.bench.tune.candidates import Candidate
from fleetserve.bench.tune.options import min_budget_s, windows
from fleetserve.bench.tune.quality import Quality
from fleetserve.bench.tune.search import Clock, Options, Point, Search, TuneError
from fleetserve.bench.tune.steps import choose
from fleetserve.catalog import ModelSpec
from fleetserve.catalog.hardware import Hardware

SPEC = ModelSpec.from_dict({"id": "o/m", "sources": ["/w"], "family": "dense"})
HW = Hardware("cpu", "x86_64", "Test CPU", 2, 8 * 2**30, frozenset({"avx2"}))


def search(**opts: object) -> Search:
    return Search(SPEC, Path("/w"), HW, "cpu-avx2", Options(**opts))  # type: ignore[arg-type]


def point(s: Search, tps: list[float], size: int = 32, procs: int = 1) -> Point:
    p = s._add(Candidate("openvino", "bf16", 2 // procs, procs, size * 64, size))
    p.samples, p.status = list(tps), "measured"
    return p


def test_the_clock_keeps_the_final_steps_reserve() -> None:
    c = Clock(100.0, reserve_s=30.0)
    assert c.fits(60.0) and not c.fits(75.0)
    assert c.fits(95.0, final=True) and not c.fits(101.0, final=True)


def test_the_budget_starts_when_the_model_is_tuned_not_before() -> None:
    s = search()
    s.clock.t0 -= 1000  # as if another model had been tuned first
    assert not s.clock.fits(1.0)
    s.start()
    assert s.clock.elapsed < 1.0 and s.clock.fits(60.0)


def test_a_budget_that_cannot_hold_a_measurement_is_refused() -> None:
    with pytest.raises(TuneError, match="too small to measure anything"):
        search(budget_s=30.0)
    assert search(budget_s=100.0).clock.budget_s == 100.0
    with pytest.raises(TuneError, match="external server"):
        Search(ModelSpec.from_dict({"id": "e/x", "sources": ["/w"], "runtime": "external"}),
               Path("/w"), HW, "cpu-avx2", Options())  # fmt: skip


def test_a_small_budget_measures_in_shorter_windows_and_its_search_fits() -> None:
    """Below 135 s a search's windows shrink with its budget (a 45th and a 60th of it,
    at least 0.5 s): 40 s then holds the reference, another candidate and the knee,
    which 3-s windows needed 52 s for. From 150 s up they are the defaults, and a quick
    search's never pass 2 and 1.5 s."""
    assert windows(600.0) == (3.0, 2.5) and windows(150.0) == (3.0, 2.5)
    assert windows(600.0, quick=True) == (2.0, 1.5)
    assert windows(45.0) == windows(45.0, quick=True) == (1.0, 0.75)
    assert windows(10.0) == (0.5, 0.5)
    assert min_budget_s(3.0) == 20.0 and min_budget_s(1.0) < 16.0
    with pytest.raises(TuneError, match="too small to measure anything"):
        search(budget_s=40.0)  # in 3-s windows
    measure_s, knee_s = windows(40.0)
    s = search(budget_s=40.0, measure_s=measure_s, knee_s=knee_s)
    assert s.clock.budget_s == 40.0 and s.warmup_s == pytest.approx(measure_s / 3)
    measure_s, knee_s = windows(33.0)  # (a fixed 20 s for the two would need 36.8)
    assert search(budget_s=33.0, measure_s=measure_s, knee_s=knee_s).clock.budget_s == 33.0
    with pytest.raises(TuneError, match="too small to measure anything"):
        search(budget_s=25.0, measure_s=0.5, knee_s=0.5)


def test_the_fastest_point_wins_beyond_the_noise() -> None:
    s = search()
    slow, fast = point(s, [9000.0], 16), point(s, [10000.0], 64)
    s.noise = 0.02
    assert choose(s) is fast and fast.status == "won"
    assert slow.status == "lost" and slow.reason == "0.90x the winner's throughput"


def test_within_the_noise_the_simpler_point_wins() -> None:
    s = search()
    big = point(s, [10000.0, 10100.0], 128)
    small = point(s, [9900.0], 16)
    two = point(s, [10300.0], 32, procs=2)
    s.noise = 0.04
    assert choose(s) is small
    assert "within the noise" in big.reason and "smaller batch" in big.reason
    assert "fewer processes" in two.reason


def test_within_the_noise_a_point_as_simple_as_the_winner_loses_on_its_median() -> None:
    s = search()
    fp32 = point(s, [10000.0], 64)
    fp16 = s._add(Candidate("openvino", "fp16", 2, 1, 64 * 64, 64))
    fp16.samples, fp16.status = [9990.0], "measured"
    s.noise = 0.02
    assert choose(s) is fp32
    assert fp16.reason == (
        "1.00x the winner: within the noise (2%), and as simple as the winner, "
        "whose median was higher"
    )


def test_the_median_of_samples_is_the_figure() -> None:
    s = search()
    p = point(s, [1.0, 100.0])
    assert p.tokens_per_s == pytest.approx(50.5)  # not the max of two


def test_the_grid_is_refined_around_its_best_point() -> None:
    grid = cands.batch_grid("dense", "cpu")
    assert grid == sorted(grid) and len(grid) >= 3
    mids = cands.refine(grid, grid[1])
    assert len(mids) == 2
    assert grid[0][0] < mids[0][0] < grid[1][0] < mids[1][0] < grid[2][0]
    assert cands.refine(grid, (12345, 7)) == []  # not on the grid: nothing to refine


def test_layouts_use_every_core() -> None:
    assert cands.thread_layouts(HW) == [(2, 1), (1, 2)]
    four = Hardware("cpu", "x86_64", "t", 4, 1, frozenset())
    assert all(t * p == 4 for t, p in cands.thread_layouts(four))


def test_engines_start_with_the_reference_and_skip_what_is_absent() -> None:
    engines = cands.engines(SPEC)
    assert engines[0] == ("torch", "fp32")
    gen = ModelSpec.from_dict({"id": "g/m", "sources": ["/w"], "family": "generate"})
    assert {rt for rt, _ in cands.engines(gen)} == {"torch"}
    assert ("openvino", "bf16") not in cands.engines(SPEC, kind="cuda")


@pytest.mark.parametrize(
    ("quick", "features", "tried_fp16"),
    [
        (True, {"avx2", "avx512_bf16"}, False),  # emulated: a quick search passes it by
        (True, {"avx2", "avx512_bf16", "avx512_fp16"}, True),  # native
        (False, {"avx2", "avx512_bf16"}, True),  # the full search tries everything
    ],
)
async def test_a_quick_search_skips_precisions_this_cpu_would_emulate(
    quick: bool, features: set[str], tried_fp16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch fp16 emulated on a 2-core CPU took windows longer than the server's idle
    # spells under light traffic, so the quick search spent minutes re-measuring it
    hw = Hardware("cpu", "x86_64", "Test CPU", 2, 8 * 2**30, frozenset(features))
    opts = Options(quick=quick, start=("openvino", "bf16"))
    s = Search(SPEC, Path("/w"), hw, "cpu-avx512bf16", opts)
    tried: list[tuple[str, str]] = []

    async def measured(searched: Search, p: Point) -> None:
        tried.append(p.cand.engine)
        p.status, p.samples = "measured", [1000.0]

    monkeypatch.setattr(screening, "gate_and_measure", measured)
    await screening.screen(s)
    assert tried[:2] == [("torch", "fp32"), ("openvino", "bf16")]  # reference, then pick
    fp16 = [p for p in s.points if p.cand.precision == "fp16"]
    assert fp16 and all((p.cand.engine in tried) == tried_fp16 for p in fp16)
    if not tried_fp16:
        assert all(p.status == "skipped" and "no native fp16" in p.reason for p in fp16)
    assert ("torch", "bf16") in tried  # native here: never skipped


class GateStack:
    """A stack whose quality set takes ``seconds[precision]`` and always passes."""

    def __init__(self, c: Candidate, seconds: dict[str, float], whole: bool = False) -> None:
        self.wait = seconds[c.precision]
        self.whole = whole  # one request: the deadline is never looked at within it
        self.family = SimpleNamespace(runtime=SimpleNamespace(precision=c.precision))

    async def __aenter__(self) -> GateStack:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def compute(self, *args: object) -> list[str]:
        """As ``quality.replies`` does: the deadline is looked at between requests
        (here, every 10 ms of its time)."""
        deadline, times = args[-2], args[-1]
        assert isinstance(times, list)
        times.append(self.wait)
        end = time.monotonic() + self.wait
        while time.monotonic() < end:
            if not self.whole and isinstance(deadline, float) and time.monotonic() > deadline:
                raise TimeoutError("past its deadline")
            await asyncio.sleep(0.01)
        return ["reply"]


WINDOW_S = 0.1
"""A window's seconds unless told: a candidate's window may run SLOW_X times the
reference's, so a reference window of no time at all (a bare ``sleep(0)``) cut the
next one's under load (CI, stop 53: fp16 was not measured)."""


def gated_search(
    monkeypatch: pytest.MonkeyPatch,
    seconds: dict[str, float],
    measured: list[str] | None = None,
    whole: bool = False,
    windows: dict[str, float] | None = None,
) -> Search:
    """A search of torch alone whose quality sets take ``seconds[precision]`` and pass,
    and whose saturation windows only record the precision in ``measured`` (after
    ``windows[precision]`` seconds, WINDOW_S unless told); ``whole``: each quality set
    is one request, never cut within."""
    from fleetserve.bench.tune import screening

    monkeypatch.setattr(screening, "compare", lambda ref, got: Quality("cos", 1.0, 0.99, True))
    monkeypatch.setattr(slow, "MIN_GATE_S", 0.0)  # (10 s for real models)
    monkeypatch.setattr(cands, "runtimes_for", lambda *a: [("torch", "")])
    s = search()
    s._stack = lambda c: GateStack(c, seconds, whole)  # type: ignore[assignment,method-assign,return-value]

    async def measure(stack: object, p: Point, warm_limit: float | None = None) -> None:
        await asyncio.sleep((windows or {}).get(p.cand.precision, WINDOW_S))
        if measured is not None:
            measured.append(p.cand.precision)
        p.samples = [1000.0]

    s._measure = measure  # type: ignore[assignment,method-assign]
    return s


async def test_a_candidate_far_slower_than_the_reference_is_not_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch bf16 emulated on cpu-avx2 ran at 0.15x fp32, and its saturation windows
    took 7 minutes of a 10-minute tune: a candidate over SLOW_X times slower than the
    reference on the quality set is passed by with the reason, and still counts as
    judged (the reference may win alone)."""

    measured: list[str] = []
    seconds = {"fp32": 0.05, "bf16": 0.05 * (slow.SLOW_X + 2), "fp16": 0.1}
    s = gated_search(monkeypatch, seconds, measured)
    await screening.screen(s)
    assert measured == ["fp32", "fp16"]  # fp16 is 2x slower: measured, it may batch better
    (bf16,) = [p for p in s.points if p.cand.precision == "bf16"]
    assert bf16.status == "skipped" and bf16.reason.startswith(slow.SLOWER)
    assert "cut at" in bf16.reason  # once it had run SLOW_X times the reference's time


async def test_a_quality_set_that_runs_too_long_is_cut_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gate itself of an emulated precision took over 6 minutes for a 110M model:
    it is cut once it has run SLOW_X times the reference's time."""
    s = gated_search(monkeypatch, {"fp32": 0.02, "bf16": 60.0, "fp16": 0.02})
    await asyncio.wait_for(screening.screen(s), 10)  # not the minute bf16 would take
    (bf16,) = [p for p in s.points if p.cand.precision == "bf16"]
    assert bf16.status == "skipped" and "cut at" in bf16.reason


async def test_a_quality_set_whose_last_request_ran_past_the_limit_is_not_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline is looked at between requests, so a last request can run past it:
    torch bf16 of a 110M model on cpu-avx2 finished its gate in 22 s against a 16 s limit
    and then spent minutes at saturation. A set that ended over SLOW_X times the
    reference's per request is too slow."""
    measured: list[str] = []
    s = gated_search(monkeypatch, {"fp32": 0.05, "bf16": 0.4, "fp16": 0.05}, measured, True)
    await screening.screen(s)
    assert measured == ["fp32", "fp16"]
    (bf16,) = [p for p in s.points if p.cand.precision == "bf16"]
    assert bf16.status == "skipped" and bf16.reason.startswith(slow.SLOWER), bf16.reason
    assert "cut at" not in bf16.reason  # it ran to its end, then was judged


async def test_a_window_over_slow_x_the_reference_s_is_cut_and_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small quality set can hide a slowness that larger batches show: torch bf16 of
    the 110M model was 3-4x on the set and 6x at saturation, where one window ran for
    minutes. A window may run SLOW_X times the reference's, then it is cut."""
    measured: list[str] = []
    gates = {"fp32": 0.01, "bf16": 0.01, "fp16": 0.01}
    windows = {"fp32": 0.05, "bf16": 30.0, "fp16": 0.05}
    s = gated_search(monkeypatch, gates, measured, windows=windows)
    await asyncio.wait_for(screening.screen(s), 10)  # not bf16's 30 s
    assert measured == ["fp32", "fp16"]
    (bf16,) = [p for p in s.points if p.cand.precision == "bf16"]
    assert bf16.status == "skipped" and bf16.reason.startswith(slow.SLOWER), bf16.reason
    assert "at saturation" in bf16.reason and not bf16.samples
    assert [p.cand.precision for p in s.measured()] == ["fp32", "fp16"]


async def test_a_window_that_would_pass_the_budget_is_cut_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However fast, no candidate's window runs past the budget (item 6: the search
    ends within --budget)."""
    windows = {"fp32": 0.05, "bf16": 0.05, "fp16": 30.0}
    s = gated_search(monkeypatch, {"fp32": 0.01, "bf16": 0.01, "fp16": 0.01}, windows=windows)
    monkeypatch.setattr(slow, "SLOW_X", 1e6)  # (only the budget cuts here)
    monkeypatch.setattr(screening, "SLOW_X", 1e6)
    s.clock.fits = lambda seconds, final=False: True  # type: ignore[method-assign]
    s.clock.left = lambda final=False: 0.3  # type: ignore[method-assign]
    await asyncio.wait_for(screening.screen(s), 10)
    (fp16,) = [p for p in s.points if p.cand.precision == "fp16"]
    assert fp16.status == "skipped" and "budget ran out during its window" in fp16.reason


async def test_a_runtimes_import_is_not_priced_as_its_candidates_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first load on a runtime imports its library (torch and transformers: 4.8 s
    of the reference's 4.9 s for a tiny BERT on a 2-core cpu-avx2). A load's seconds
    price the next candidate and the final steps' reserve, so an import counted there
    left a 30 s quick search room for the reference alone under load. Imported first,
    on the clock: each load's seconds are the load's."""
    imported: set[str] = set()
    IMPORT_S = 0.3

    def import_runtimes(names: object) -> None:
        assert isinstance(names, list)
        for name in names:
            if name not in imported:
                time.sleep(IMPORT_S)
                imported.add(name)

    class Importing(GateStack):
        async def __aenter__(self) -> GateStack:  # a load imports what is not yet
            import_runtimes(["torch"])
            return self

    monkeypatch.setattr(screening, "import_runtimes", import_runtimes)
    s = gated_search(monkeypatch, {"fp32": 0.01, "bf16": 0.01, "fp16": 0.01})
    s._stack = lambda c: Importing(c, {"fp32": 0.01, "bf16": 0.01, "fp16": 0.01})  # type: ignore[assignment,method-assign,return-value]
    await screening.screen(s)
    assert imported == {"torch"} and s.clock.elapsed >= IMPORT_S  # paid, once, on the clock
    loads = [q.load_s for q in s.points if q.status == "measured"]
    assert len(loads) == 3 and max(loads) < IMPORT_S / 2, loads


async def test_the_reference_may_win_alone_when_the_rest_is_too_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = gated_search(monkeypatch, {"fp32": 0.02, "bf16": 0.2, "fp16": 0.2})
    await screening.screen(s)  # no "nothing to choose between": the others were judged too slow
    assert [p.cand.precision for p in s.measured()] == ["fp32"]


def test_a_quick_search_of_a_slow_model_sends_smaller_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 110M model on 2 cores took 64 s per window of 32-text requests, more than a
    60 s quick search: its windows are priced per token from the reference's quality
    set, and the requests halved until a window takes about a sixth of the budget."""
    from fleetserve.bench.tune.harness import Request
    from fleetserve.runtimes.calibration import CALIBRATION
    from fleetserve.wire import Task

    monkeypatch.setattr(screening, "token_counter", lambda path, n: lambda text: 10)
    built: list[int] = []

    def requests(spec: object, path: object, kind: str, batch: int) -> list[Request]:
        built.append(batch)
        return [Request(Task.ENCODE, b"{}", 50 * batch, batch)] * 4

    monkeypatch.setattr(screening, "requests", requests)
    calib_tokens = 10 * len(CALIBRATION)

    def quick_search(ms_per_token: float) -> Search:
        s = search(quick=True, budget_s=60.0)
        s.requests = [Request(Task.ENCODE, b"{}", 50 * 32, 32)] * 4  # 50 tokens per item
        screening.quick_requests(s, [ms_per_token / 1e3 * calib_tokens / 4] * 4)
        return s

    slow = quick_search(0.5)  # a window of b items: 10 x b x 50 x 0.5 ms + 4 s
    assert built == [16] and slow.requests[0].items == 16  # 8 s; 32 would take 12 s
    assert slow.notes and "16-item requests" in slow.notes[0], slow.notes
    fast = quick_search(0.01)  # MiniLM: its windows fit as they are
    assert built == [16] and fast.requests[0].items == 32 and not fast.notes


async def test_a_model_too_slow_for_a_knee_in_the_budget_gets_none_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A knee rate's window holds at least ``KNEE_ARRIVALS`` requests: at a slow model's
    low rates that takes seconds each; where the budget cannot hold them, the knee is
    not measured (it was noise: windows of 0-3 arrivals, offered rates of 0.0)."""
    from fleetserve.bench.tune import steps

    s = search(budget_s=60.0, knee_s=0.05)
    s.clock.budget_s = s.clock.elapsed + 3.0  # 3 s left

    class Slow:  # 4 clients at 0.25 s a request: about 16 requests/s
        async def send(self, req: object) -> int:
            await asyncio.sleep(0.25)
            return 1

    p = s._add(Candidate("torch", "fp32", 2, 1, 2048, 64))
    monkeypatch.setattr(steps, "requests", lambda *a, **k: [object()])
    doc = await steps.knee(s, Slow(), p, rates_n=4)  # type: ignore[arg-type]
    assert doc["knee_rps"] is None and doc["points"] == [] and p.knee is doc
    assert doc["reason"].startswith("no knee: at ") and "20 arrivals per rate" in doc["reason"]
    from fleetserve.bench.tune.report import markdown

    run = {"model": "o/m", "hardware_class": "cpu-avx2", "machine": "m", "started_at": "t",
           "workload": "mix", "clients": 4, "batch": 32, "measure_s": 3, "budget_s": 60,
           "elapsed_s": 57, "candidates": [], "knee": doc}  # fmt: skip
    assert f"- Knee: {doc['reason']}" in markdown(run)  # the report says why
