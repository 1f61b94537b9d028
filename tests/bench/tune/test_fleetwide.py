"""Background tuning across workers (``--tune auto``, distributed): one tune per class
and model under a JetStream KV lease that a killed worker gives up, and profiles shared
so that one worker's tune serves every worker of its class. Against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from fleetserve.bench.tune.background import BackgroundTuner
from fleetserve.bench.tune.fleetwide import FleetTuning
from fleetserve.bench.tune.runs import RunStore
from fleetserve.catalog.hardware import detect
from fleetserve.catalog.profiles import read_profile_file
from fleetserve.cluster import NatsServer
from fleetserve.worker.process import WorkerProcess

from ...services import Services
from ...waiting import async_wait_for, tasks_left
from .test_background import MODEL, Host, cancelled, child_pid, settings


@contextlib.asynccontextmanager
async def shared(
    nats_server: NatsServer, prefix: str, *owners: str, ttl: float = 15.0
) -> AsyncIterator[list[FleetTuning]]:
    """One connection and one FleetTuning per owner (a worker each)."""
    conns = [await nats.connect(nats_server.url) for _ in owners]
    try:
        boards = [
            FleetTuning(nc.jetstream(), prefix, "cpu-x", o, ttl)
            for nc, o in zip(conns, owners, strict=True)
        ]
        for b in boards:
            await b.open()
        yield boards
    finally:
        for nc in conns:
            await nc.close()


TTL_S = 3.0  # a lease's life without renewals, where a test waits for one to lapse


def prefix() -> str:
    return f"ft{time.monotonic_ns()}"


async def test_of_two_workers_racing_for_one_tune_lease_exactly_one_wins(
    nats_server: NatsServer,
) -> None:
    async with shared(nats_server, prefix(), "a", "b", "c") as boards:
        won = await asyncio.gather(*(b.claim("org/m.v1.5") for b in boards))
        assert sorted(won) == [False, False, True]
        winner = boards[won.index(True)]
        assert await boards[0].holder("org/m.v1.5") == winner.owner
        await winner.release("org/m.v1.5")
        assert await boards[won.index(False)].claim("org/m.v1.5")  # free once released


async def test_a_killed_holders_lease_is_taken_over_once_it_lapses(
    nats_server: NatsServer,
) -> None:
    async with shared(nats_server, prefix(), "a", "b", ttl=1.5) as (a, b):
        renew = asyncio.create_task(a.renew_forever())
        assert await a.claim("org/m")
        await asyncio.sleep(2 * a.ttl)  # renewed: still a's, past its ttl
        assert not await b.claim("org/m") and a.holds("org/m")
        renew.cancel()  # a is killed: nobody renews
        deadline = time.monotonic() + 10 * a.ttl
        while not await b.claim("org/m"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert await b.holder("org/m") == "b"


async def test_a_shared_profile_reaches_the_others_and_a_worker_that_starts_later(
    nats_server: NatsServer,
) -> None:
    p = prefix()
    async with shared(nats_server, p, "a", "b") as (a, b):
        got: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()

        async def on_profile(model: str, text: str, by: str) -> None:
            await got.put((model, text, by))

        before = asyncio.all_tasks()
        watch = asyncio.create_task(b.watch(on_profile))
        await a.publish("org/m.v1.5", "yaml 1")
        assert await asyncio.wait_for(got.get(), 5) == ("org/m.v1.5", "yaml 1", "a")
        watch.cancel()
        assert not await tasks_left(before)  # the watch's subscription stopped too
        async with shared(nats_server, p, "c") as (c,):
            late = asyncio.create_task(c.watch(on_profile))
            assert await asyncio.wait_for(got.get(), 5) == ("org/m.v1.5", "yaml 1", "a")
            late.cancel()


async def test_a_worker_waits_while_another_holds_the_lease_then_takes_over(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    s = settings(tmp_path)
    cls = detect().hardware_class
    p = prefix()
    # the bucket's ttl drops a lease (its first opener sets it): with shared()'s 15 s,
    # the test waited 15 s for the lapse
    async with shared(nats_server, p, "killed", ttl=TTL_S) as (killed,):
        killed.cls = cls
        nc = await nats.connect(nats_server.url)
        try:
            mine = FleetTuning(nc.jetstream(), p, cls, "me", ttl=TTL_S)
            await mine.open()
            host = Host(s)
            bt = BackgroundTuner(s, host.catalog, host, cls, os.environ, mine)
            # taken last, so that the tuner's first look comes well within its ttl
            assert await killed.claim(MODEL)  # and then it dies: no renewals
            task = asyncio.create_task(bt.run())
            try:
                await async_wait_for(lambda: "killed tunes it" in bt.states[MODEL].reason, 10)
                assert child_pid(bt) is None
                await async_wait_for(lambda: child_pid(bt) is not None, 30)  # the lease lapsed
                assert mine.holds(MODEL)
            finally:
                await cancelled(task)
            assert not mine.holds(MODEL)  # released at the stop
        finally:
            await nc.close()


@pytest.mark.slow
def test_one_worker_tunes_and_the_other_swaps_in_its_profile(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    p = prefix()
    workers = []
    for name in ("w1", "w2"):
        root = tmp_path / name
        s = settings(
            root, nats=nats_server.url, queue_prefix=p, stream_storage="memory",
            worker_port=0, worker_id=name,
        )  # fmt: skip
        workers.append(WorkerProcess(s, env=os.environ))
    with Services(*workers) as svc:
        assert svc is not None

        def states() -> list[str]:
            return [w.background.states[MODEL].state if w.background else "" for w in workers]

        deadline = time.monotonic() + 240
        while states() != ["tuned", "tuned"]:
            # a tune that failed is an answer: not one to wait out the deadline for
            assert time.monotonic() < deadline and "failed" not in states(), [
                w.background and w.background.states for w in workers
            ]
            time.sleep(0.2)
        runs = [RunStore(tmp_path / n / "runs").list() for n in ("w1", "w2")]
        assert sorted(len(r) for r in runs) == [0, 1]  # exactly one tuned
        tuner, other = (0, 1) if runs[0] else (1, 0)
        cls = detect().hardware_class
        files = [tmp_path / n / "profiles" / cls / "tiny--auto-bert.yaml" for n in ("w1", "w2")]
        assert files[other].read_text() == files[tuner].read_text()
        bg = workers[other].background
        assert bg is not None
        st = bg.states[MODEL]
        assert st.reason.startswith(f"tuned by w{tuner + 1}")
        while workers[other].choices[MODEL].how != "tuned":  # (a swap takes a load)
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert workers[other].runners[MODEL].profile == read_profile_file(files[other], cls).profile
        mine = workers[tuner]
        assert mine.background is not None
        if mine.choices[MODEL].how != "tuned":  # its winner was within the noise of the rule
            assert mine.background.states[MODEL].reason.startswith("kept")


async def test_a_quick_shared_profile_is_adopted_and_refined_by_whoever_gets_the_lease(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    from fleetserve import __version__
    from fleetserve.catalog import Profile
    from fleetserve.catalog.profiles import write_profile_file

    s = settings(tmp_path, tune_refine_budget=60)
    cls = detect().hardware_class
    p = prefix()
    quick = write_profile_file(
        tmp_path / "theirs", MODEL, Profile(cls, "fp32", "torch", 512, 16),
        {"fleetserve": __version__, "quick": True, "figures": {"tokens_per_s": 1.0}},
    )  # fmt: skip
    async with shared(nats_server, p, "gone") as (gone,):
        gone.cls = cls
        await gone.publish(MODEL, quick.read_text())  # its holder died after the quick phase
        await gone.profiles.put("garbage." + "x", b"not json")  # (another class: ignored)
        nc = await nats.connect(nats_server.url)
        try:
            mine = FleetTuning(nc.jetstream(), p, cls, "me")
            await mine.open()
            host = Host(s)
            bt = BackgroundTuner(s, host.catalog, host, cls, os.environ, mine)
            task = asyncio.create_task(bt.run())
            try:
                await async_wait_for(lambda: child_pid(bt) is not None, 30)  # it refines
                assert host.choice(MODEL).how == "tuned"  # adopted meanwhile
                assert host.choice(MODEL).profile.max_batch_tokens == 512
                assert bt.states[MODEL].phase == "full"  # no quick search again
            finally:
                await cancelled(task)
        finally:
            await nc.close()


async def test_a_shared_profile_that_does_not_parse_never_stops_the_tuner(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    s = settings(tmp_path)
    cls = detect().hardware_class
    p = prefix()
    async with shared(nats_server, p, "other", "me") as (other, mine):
        other.cls = mine.cls = cls
        await other.publish(MODEL, "model: [unclosed")
        host = Host(s)
        bt = BackgroundTuner(s, host.catalog, host, cls, os.environ, mine)
        task = asyncio.create_task(bt.run())
        try:
            await async_wait_for(lambda: child_pid(bt) is not None, 30)  # it tunes it itself
            assert not task.done() and host.choice(MODEL).how == "rule"
        finally:
            await cancelled(task)
