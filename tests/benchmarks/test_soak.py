"""``python -m benchmarks soak``: growth, the requests' fates, the report, a short drive.

The soak itself (real models, minutes, many processes) is not run here.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.soak import output
from benchmarks.soak.report import analyse, growth, outcomes_summary, series, warmup_end
from benchmarks.soak.rss import tree
from benchmarks.soak.traffic import Ctx, Outcome, drive

from ..conftest import TINY, ServerThread

MIB = 2**20


def flat_then(rise: float) -> list[tuple[float, float]]:
    """RSS 100 MiB until 60 s, then ``rise`` (a fraction) higher from 120 s on."""
    return [(float(t), 100 * MIB * (1 + (rise if t >= 120 else 0))) for t in range(0, 181, 2)]


def test_growth_is_last_window_median_over_first_after_warmup() -> None:
    g = growth(flat_then(0.10), warm=60, window=30, end=180)
    assert g["growth_pct"] == pytest.approx(10.0)
    assert g["first"] == 100 * MIB and g["peak"] == pytest.approx(110 * MIB)
    # a spike inside the window moves a median little, a mean a lot
    spiky = [(t, v * (5 if t == 170 else 1)) for t, v in flat_then(0.0)]
    assert growth(spiky, 60, 30, 180)["growth_pct"] == 0.0
    # what warm-up holds does not count
    early = [(t, v * (3 if t < 60 else 1)) for t, v in flat_then(0.0)]
    assert growth(early, 60, 30, 180)["growth_pct"] == 0.0


def test_a_process_that_did_not_live_through_both_windows_has_no_growth() -> None:
    killed = [p for p in flat_then(0.0) if p[0] < 100]
    replacement = [p for p in flat_then(0.0) if p[0] > 110]
    assert growth(killed, 60, 30, 180)["growth_pct"] is None
    assert growth(replacement, 60, 30, 180)["growth_pct"] is None


def test_series_sums_roles_and_total_and_skips_the_dead() -> None:
    samples = [
        {"t": 0.0, "rss": {"gateway": 10, "worker-a": 100, "worker-b": 200, "nats": 5}},
        {"t": 5.0, "rss": {"gateway": 11, "worker-b": 0, "worker-c": 150, "nats": 6}},
    ]
    roles = {"gateway": "gateway", "worker-a": "worker", "worker-b": "worker", "worker-c": "worker"}
    s = series(samples, roles)
    assert s["role:worker"] == [(0.0, 300), (5.0, 150)]
    assert s["total"] == [(0.0, 315), (5.0, 167)]
    assert s["worker-b"] == [(0.0, 200)] and s["role:nats"] == [(0.0, 5), (5.0, 6)]


def outcome(op: str, result: str, attempts: list[list[Any]], status: int | None = None) -> Outcome:
    done = attempts[-1][1] + 0.1 if attempts else None
    return Outcome(op, attempts[0][1] if attempts else 0.0, 0.0, done, result, status, "", attempts)


def test_only_503s_in_a_disruption_window_are_expected() -> None:
    t0 = 1000.0
    events = [{"event": "restart nats", "start": t0 + 50, "end": t0 + 52}]
    outs = [
        outcome("dense", "ok", [[503, 50.5], [503, 51.5], [200, 53.0]], 200),  # retried through
        outcome("dense", "ok", [[503, 20.0], [200, 21.0]], 200),  # a 503 out of any window
        # sent just before the restart, answered 503 during it: in flight when NATS went
        outcome("dense", "ok", [[503, 49.9, 55.0], [200, 55.2, 55.3]], 200),
        outcome("dense", "ok", [[503, 10.0, 12.0], [200, 12.1, 12.2]], 200),  # long before
        outcome("chat", "http", [[500, 30.0]], 500),  # a final 500
        outcome("sparse", "http", [[404, 31.0]], 404),
        outcome("sparse", "lost", [["ReadTimeout", 40.0]]),
        outcome("rerank", "lost", []),  # never answered by the end of the run
    ]
    s = outcomes_summary(outs, events, t0, settle=15.0)
    assert s["sent"] == 8 and s["served"] == 4 and s["lost"] == 2
    assert s["errors_by_status"] == {"404": 1, "500": 1}
    assert s["expected_503"] == 3
    assert s["unexpected_5xx"] == 2 + 1 + 1  # the stray 503s, the 500 attempt, the final 500
    assert s["attempts_by_status"]["503"] == 5 and s["retried"] == 4
    assert s["ops"]["dense"]["ok"] == 4


def test_warmup_waits_for_every_kind_of_request_to_be_answered() -> None:
    outs = [outcome("dense", "ok", [[200, 1.0]], 200), outcome("chat", "ok", [[200, 70.0]], 200)]
    assert warmup_end(outs, 30.0) == pytest.approx(70.1)
    assert warmup_end(outs[:1], 30.0) == 30.0


def report(samples: list[dict[str, Any]], outs: list[Outcome]) -> dict[str, Any]:
    r = analyse(samples, {"server": "server"}, outs, [], t0=0.0, seconds=180, warmup=60, window=30)
    r |= {
        "run": {"mode": "embedded", "minutes": 3, "seconds": 180, "rate": 2.0,
                "max_in_flight": 8, "models": [TINY], "adapter": None,
                "no_disruption": "none"},
        "machine": {"class": "cpu-test", "summary": "a test"},
        "load": {"mean": 1.0, "max": 2.0},
        "roles": {"server": "server"},
        "samples": samples,
        "requests_timeline": [(o.sent, o.result) for o in outs],
    }  # fmt: skip
    return r


def test_the_targets_and_the_files(tmp_path: Path) -> None:
    samples = [{"t": t, "rss": {"server": v}, "load1": 1.0} for t, v in flat_then(0.02)]
    outs = [outcome("dense", "ok", [[200, float(t)]], 200) for t in range(0, 170, 3)]
    r = report(samples, outs)
    assert r["met"] and r["rss"]["total"]["growth_pct"] == pytest.approx(2.0)
    paths = output.write(tmp_path, "soak-embedded-cpu-test", r)
    assert json.loads(paths[0].read_text())["met"] is True
    md = paths[1].read_text()
    assert "+2.00 %" in md and "**not met**" not in md
    assert paths[2].read_bytes()[:4] == b"\x89PNG"

    leaky = [{"t": t, "rss": {"server": v}, "load1": 1.0} for t, v in flat_then(0.08)]
    lost = [*outs, outcome("dense", "lost", [["ReadTimeout", 100.0]])]
    bad = report(leaky, lost)
    assert not bad["met"]
    assert bad["targets"] == {
        "rss_total_under_5pct": False,
        "rss_each_process_under_5pct": False,
        "zero_lost": False,
        "zero_unexpected_5xx": True,
    }
    assert "**not met**" in output.markdown(bad)


def test_tree_sums_a_process_and_its_children() -> None:
    rss, cpu = tree(os.getpid())
    assert rss > 10 * MIB and cpu > 0
    assert tree(2**22 + 12345) == (0, 0.0)  # beyond pid_max: gone


async def test_the_sdk_retries_503s_and_each_attempt_is_counted() -> None:
    calls: dict[bytes, int] = {}

    def handler(request: httpx.Request) -> httpx.Response:  # per request: 503, 503, 200
        calls[request.content] = calls.get(request.content, 0) + 1
        if calls[request.content] <= 2:
            return httpx.Response(503, headers={"retry-after": "0"}, json={"error": {}})
        return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]})

    from benchmarks.soak.traffic import _chat

    mix = {"chat": (1.0, _chat)}
    t0 = time.time()
    outs = await drive(
        "http://soak.test", 1.0, 20.0, t0, adapter=None, mix=mix, inner=httpx.MockTransport(handler)
    )
    assert outs
    assert all(o.result == "ok" and [a[0] for a in o.attempts] == [503, 503, 200] for o in outs)


async def test_a_short_drive_against_a_live_server(tiny_server: ServerThread) -> None:
    async def dense(c: Ctx) -> None:
        out = await c.sdk.encode(TINY, ["a short text", "another"])
        assert out.shape[0] == 2

    async def missing(c: Ctx) -> None:
        await c.sdk.encode("no/such-model", ["x"])

    async def hangs(c: Ctx) -> None:
        await asyncio.Event().wait()

    mix = {"dense": (0.8, dense), "missing": (0.1, missing), "hangs": (0.1, hangs)}
    t0 = time.time()
    fired = asyncio.Event()

    async def disruption() -> None:
        fired.set()

    outs = await drive(
        tiny_server.url, 2.0, 15.0, t0, adapter=None, mix=mix, grace=1.0, seed=3,
        at={0.5: disruption},
    )  # fmt: skip
    assert fired.is_set()
    by = {op: [o for o in outs if o.op == op] for op in mix}
    assert all(by.values()), "each kind of request was sent"
    assert all(o.result == "ok" and o.attempts[-1][0] == 200 for o in by["dense"])
    assert all(o.result == "http" and o.status == 404 for o in by["missing"])
    assert all(o.result == "lost" and "still waiting" in o.error for o in by["hangs"])
