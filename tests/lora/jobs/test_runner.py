"""The runner's own paths, with no training needed: a record that breaks the trainer
fails alone and the next job runs; a job started too often fails saying so; a worker
that stops puts its job back without counting an attempt; a trainer that lost its
job to another writes nothing."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from fleetserve.catalog.hardware import memory_source
from fleetserve.finetune_setup import limited_trainer, memory_limit, training_share
from fleetserve.fleet.manager import Fleet
from fleetserve.fleet.policy import GDSF
from fleetserve.lora.bases import StaticBases
from fleetserve.lora.jobs.manager import FineTuning, TrainLimits
from fleetserve.lora.jobs.queue import JobRef, MemoryJobQueue
from fleetserve.lora.jobs.room import TrainMemory
from fleetserve.lora.jobs.runner import JobRunner
from fleetserve.lora.jobs.specs import TrainBase
from fleetserve.lora.jobs.store import ROOT, JobStore
from fleetserve.lora.registry import AdapterRegistry
from fleetserve.lora.store import AdapterStore
from fleetserve.lora.train import TrainResult, TrainSpec
from fleetserve.lora.validate import Limits
from fleetserve.settings import Settings
from fleetserve.storage import MemoryStore
from fleetserve.wire import OPEN, Cancelled, InvalidInput
from fleetserve.wire.finetune import Job, JobStatus
from tests.tinymodels import build_bert
from tests.waiting import async_wait_for

from ...fleet.test_manager import Clock, FakeModel


def pairs(n: int = 8) -> bytes:
    rows = ({"query": f"q{i % 4}", "positive": f"answer {i}"} for i in range(n))
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


class Bases:
    """``base_of`` for the runner: each call waits for ``go``, then says no weights."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.go = asyncio.Event()

    async def __call__(self, model: str) -> TrainBase:
        self.asked.set()
        await self.go.wait()
        raise InvalidInput(f"no weights for {model} here", field="model")


def setup() -> tuple[FineTuning, MemoryJobQueue, JobRunner, Bases]:
    store = JobStore(AdapterStore(MemoryStore()))
    queue = MemoryJobQueue()
    ft = FineTuning(store, queue, {"m": "dense"}.get, TrainLimits(min_pairs=4))
    registry = AdapterRegistry(store.store, limits=Limits(), bases=StaticBases({}))
    bases = Bases()
    return ft, queue, JobRunner(store, queue, registry, bases, max_attempts=2), bases


async def job(ft: FineTuning) -> Job:
    f = await ft.create_file(OPEN, "p.jsonl", pairs())
    return await ft.create_job(OPEN, {"model": "m", "training_file": f.id})


async def test_a_broken_record_fails_alone_and_the_next_job_runs() -> None:
    ft, queue, runner, bases = setup()
    await queue.submit(JobRef("default", "ftjob-broken"))
    await ft.store.store.put(f"{ROOT}/jobs/default/ftjob-broken.json", b'{"id": 1}')
    good = await job(ft)
    bases.go.set()
    task = asyncio.ensure_future(runner.run())
    try:

        async def failed() -> bool:
            return (await ft.job(OPEN, good.id)).status is JobStatus.FAILED

        await async_wait_for(failed, 10.0, "the broken job to fail")
        done = await ft.job(OPEN, good.id)
        assert done.error is not None and done.error["field"] == "model"
        assert "no weights for m" in done.error["message"] and not task.done()
    finally:
        task.cancel()


async def test_a_finished_record_follows_the_event_that_says_why() -> None:
    """Whoever sees a job finished finds its last event: the record is written after
    it (a cancel's caller read the events as soon as the record said cancelled, and a CI
    run found no "cancelled while training" among them). Before: record, then event."""
    ft, queue, runner, bases = setup()
    j = await job(ft)
    seen: list[tuple[str, str]] = []  # (status, last event) at each finished record
    put_job = ft.store.put_job

    async def watched(record: Job) -> None:
        if record.status.finished:
            events, _ = await ft.events(OPEN, record.id, limit=1)
            seen.append((record.status.value, events[0]["message"]))
        await put_job(record)

    ft.store.put_job = watched  # type: ignore[method-assign]
    bases.go.set()
    lease = await queue.take(1.0)
    assert lease is not None
    await runner.handle(lease)  # fails: no weights for m
    queued = await job(ft)
    await ft.cancel(OPEN, queued.id)  # cancelled while queued
    assert seen == [
        ("failed", "no weights for m here"),
        ("cancelled", "cancelled before training began"),
    ], seen
    assert (await ft.job(OPEN, j.id)).status is JobStatus.FAILED


async def test_a_job_started_too_often_fails_saying_so() -> None:
    ft, queue, runner, _ = setup()
    j = await job(ft)
    await ft.store.put_job((await ft.job(OPEN, j.id)).with_(attempts=2))
    lease = await queue.take(1.0)
    assert lease is not None
    await runner.handle(lease)
    done = await ft.job(OPEN, j.id)
    assert done.status is JobStatus.FAILED and "started 2 times" in done.error["message"]  # type: ignore[index]
    assert await queue.take(0.01) is None  # settled


async def test_a_stopping_worker_puts_its_job_back_without_an_attempt() -> None:
    ft, queue, runner, bases = setup()
    j = await job(ft)
    task = asyncio.ensure_future(runner.run())
    await asyncio.wait_for(bases.asked.wait(), 10)
    assert (await ft.job(OPEN, j.id)).status is JobStatus.RUNNING
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    back = await ft.job(OPEN, j.id)
    assert back.status is JobStatus.QUEUED and back.attempts == 0 and back.owner is None
    lease = await queue.take(1.0)
    assert lease is not None and lease.ref.job_id == j.id and lease.deliveries == 2
    messages = [e["message"] for e in (await ft.events(OPEN, j.id, limit=50))[0]]
    assert "the worker stopped; job queued again" in messages


async def test_a_trainer_that_lost_its_job_writes_nothing() -> None:
    ft, queue, runner, bases = setup()
    j = await job(ft)
    lease = await queue.take(1.0)
    assert lease is not None
    handling = asyncio.ensure_future(runner.handle(lease))
    await asyncio.wait_for(bases.asked.wait(), 10)
    other = (await ft.job(OPEN, j.id)).with_(owner="another-trainer")
    await ft.store.put_job(other)  # redelivered meanwhile: another trainer holds it
    bases.go.set()
    await handling
    assert await ft.job(OPEN, j.id) == other  # not failed over the other's work


async def test_a_trainer_whose_job_was_taken_over_stops_training() -> None:
    """Another trainer takes the job over mid-training (its token in the record): this
    one's training is stopped within a tick, and it writes nothing. Fails on the code
    before: it trained on to the end beside the new owner (the wait times out)."""
    ft, queue, _, _ = setup()
    started = asyncio.Event()

    async def base_of(model: str) -> TrainBase:
        return TrainBase("/nowhere", "mean", True, 32)

    async def train(spec: object, on_event: object, cancel: asyncio.Event) -> object:
        started.set()
        await cancel.wait()  # the child process is terminated when this is set
        raise Cancelled("cancelled while training")

    runner = JobRunner(ft.store, queue, runner_registry(ft), base_of, train=train)  # type: ignore[arg-type]
    j = await job(ft)
    lease = await queue.take(1.0)
    assert lease is not None
    handling = asyncio.ensure_future(runner.handle(lease))
    await asyncio.wait_for(started.wait(), 10)
    other = (await ft.job(OPEN, j.id)).with_(owner="another-trainer", attempts=2)
    await ft.store.put_job(other)
    await asyncio.wait_for(handling, 10)
    assert await ft.job(OPEN, j.id) == other  # nothing written over the new owner's


def runner_registry(ft: FineTuning) -> AdapterRegistry:
    return AdapterRegistry(ft.store.store, limits=Limits(), bases=StaticBases({}))


@pytest.mark.slow
async def test_a_job_whose_child_runs_out_of_memory_fails_saying_so(tmp_path: Path) -> None:
    """Today the child has no memory limit and a job that outgrows the machine dies by
    the OOM killer's SIGKILL ("training failed: ... died without a result"). Here the
    runner's child is capped (at 256 MiB, which importing torch passes) and the job
    fails with code out_of_memory, naming the limit."""
    store = JobStore(AdapterStore(MemoryStore()))
    queue = MemoryJobQueue()
    ft = FineTuning(store, queue, {"m": "dense"}.get, TrainLimits(min_pairs=4))
    registry = AdapterRegistry(store.store, limits=Limits(), bases=StaticBases({}))
    bert = str(build_bert(tmp_path / "bert"))

    async def base_of(model: str) -> TrainBase:
        return TrainBase(bert, "mean", True, 16)

    runner = JobRunner(store, queue, registry, base_of, train=limited_trainer(256 << 20))
    j = await job(ft)
    lease = await queue.take(1.0)
    assert lease is not None
    await asyncio.wait_for(runner.handle(lease), 120)
    done = await ft.job(OPEN, j.id)
    assert done.status is JobStatus.FAILED and done.error is not None
    assert done.error["code"] == "out_of_memory"
    assert "ran out of memory" in done.error["message"]
    assert "limit 256 MiB, train_memory_limit" in done.error["message"]


def test_train_memory_limit_is_a_size_a_percent_or_none() -> None:
    """Today there is no train_memory_limit."""
    total = memory_source()[0]
    for text, want in (("2GiB", 2 << 30), ("800M", 800 << 20), ("0", 0), ("", 0), ("off", 0)):
        assert memory_limit(Settings.load(overrides={"train_memory_limit": text})) == want
    default = memory_limit(Settings.load(overrides={}))  # three quarters of the memory
    assert abs(default - total * 3 // 4) <= 1
    with pytest.raises(ValueError, match="--train-memory-limit: cannot use 'lots'"):
        memory_limit(Settings.load(overrides={"train_memory_limit": "lots"}))


async def test_a_failed_training_records_its_kind_but_no_hosts_or_paths(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the job record (which its tenant reads) said 'training failed: <the
    exception's whole text>', hosts, URLs and server paths included. The server's log
    says when the job started and how it ended, one line each."""
    caplog.set_level(logging.INFO, "fleetserve.train")
    ft, queue, _, _ = setup()
    registry = AdapterRegistry(ft.store.store, limits=Limits(), bases=StaticBases({}))
    bert = str(build_bert(tmp_path / "bert"))

    async def base_of(model: str) -> TrainBase:
        return TrainBase(bert, "mean", True, 16)

    async def broken(*args: object) -> object:
        raise OSError("GET http://10.0.0.7:9000/b/k from s3.internal.example:443 failed\n"
                      "at /srv/fleetserve/cache/run-1/model.bin")  # fmt: skip

    runner = JobRunner(ft.store, queue, registry, base_of, train=broken)  # type: ignore[arg-type]
    j = await job(ft)
    lease = await queue.take(1.0)
    assert lease is not None
    await runner.handle(lease)
    done = await ft.job(OPEN, j.id)
    assert done.status is JobStatus.FAILED and done.error is not None
    message = done.error["message"]
    assert message.startswith("training failed: OSError: GET <url> from <host> failed"), message
    said = [r.getMessage() for r in caplog.records if r.name == "fleetserve.train"]
    assert any(f"fine-tuning job {j.id} of {j.tenant} started: " in m for m in said), said
    assert any(f"fine-tuning job {j.id} of {j.tenant} failed: training failed" in m for m in said)
    for internal in ("10.0.0.7", "9000", "s3.internal", "/srv/", "model.bin"):
        assert internal not in message


def test_train_memory_share_is_a_size_a_percent_of_the_budget_or_none() -> None:
    budget = 1 << 30
    for text, want in (("25%", budget // 4), ("300MiB", 300 << 20), ("0", 0)):
        assert training_share(Settings.load(overrides={"train_memory_share": text}), budget) == want
    assert training_share(Settings.load(overrides={}), budget) == budget // 4  # the default
    with pytest.raises(ValueError, match="--train-memory-share: cannot use 'half'"):
        training_share(Settings.load(overrides={"train_memory_share": "half"}), budget)


async def busy_fleet() -> Fleet:
    """A 100 MiB fleet whose 60 MiB model is busy: it cannot leave until released."""
    clock = Clock()
    fleet = Fleet(100 << 20, GDSF(), clock=clock, room_wait=0.0)
    fleet.add(FakeModel(clock, "busy", 60))
    await fleet.acquire("busy", timeout=10.0)
    return fleet


async def nowhere(model: str) -> TrainBase:
    return TrainBase("/nowhere", "mean", True, 32)


async def handled(
    ft: FineTuning, queue: MemoryJobQueue, runner: JobRunner
) -> tuple[Job, asyncio.Future[None]]:
    """A new job, taken and being handled by ``runner`` (its task)."""
    j = await job(ft)
    lease = await queue.take(1.0)
    assert lease is not None
    return j, asyncio.ensure_future(runner.handle(lease))


async def feed(ft: FineTuning, j: Job) -> list[str]:
    return [e.message for e in await ft.store.events(j.tenant, j.id)]


async def test_a_job_trains_within_its_share_held_in_the_fleet_and_waits_for_room() -> None:
    """The job's share of the fleet's budget goes to the trainer (``memory_share``) and
    is held in the fleet while it trains: here a busy model holds the room, so the job
    waits (the feed says so once), then trains once the model may leave, and the share
    is given back when it ends. Today the share is not charged at all."""
    ft, queue, _, _ = setup()
    fleet = await busy_fleet()
    seen: list[tuple[int, int]] = []  # (the spec's share, what the fleet held) at training

    async def train(spec: TrainSpec, on_event: object, cancel: asyncio.Event) -> object:
        seen.append((spec.memory_share, fleet.used()))
        raise Cancelled("cancelled while training")  # enough: the share was held

    memory = TrainMemory(lambda: fleet.budget // 2, fleet.room.beside)
    runner = JobRunner(ft.store, queue, runner_registry(ft), nowhere, train=train,  # type: ignore[arg-type]
                       memory=memory)  # fmt: skip
    j, handling = await handled(ft, queue, runner)

    async def waiting() -> bool:
        return any("waiting for 50 MiB of the memory budget" in m for m in await feed(ft, j))

    await async_wait_for(waiting, 10)
    assert seen == []  # not before there is room
    fleet.release("busy")
    await asyncio.wait_for(handling, 10)
    assert seen == [(50 << 20, 50 << 20)]  # the model left; the share was held
    assert fleet.used() == 0  # and given back
    assert sum("waiting for 50 MiB" in m for m in await feed(ft, j)) == 1


def never_room(ft: FineTuning, queue: MemoryJobQueue, fleet: Fleet) -> JobRunner:
    """A runner whose jobs want 50 MiB of ``fleet`` and must never get to train."""

    async def train(*args: object) -> object:
        raise AssertionError("it never had room to train")

    memory = TrainMemory(lambda: 50 << 20, fleet.room.beside)
    return JobRunner(ft.store, queue, runner_registry(ft), nowhere, train=train,  # type: ignore[arg-type]
                     memory=memory)  # fmt: skip


async def waits(ft: FineTuning, j: Job) -> bool:
    """Whether ``j``'s feed says it waits for memory."""
    return any("waiting for" in m for m in await feed(ft, j))


async def test_a_job_cancelled_while_it_waits_for_room_is_cancelled() -> None:
    ft, queue, _, _ = setup()
    fleet = await busy_fleet()
    runner = never_room(ft, queue, fleet)
    j, handling = await handled(ft, queue, runner)

    await async_wait_for(lambda: waits(ft, j), 10)
    await ft.cancel(OPEN, j.id)
    await asyncio.wait_for(handling, 10)
    done = await ft.job(OPEN, j.id)
    assert done.status is JobStatus.CANCELLED and fleet.used() == 60 << 20


async def test_a_worker_stopping_while_a_job_waits_for_room_puts_the_job_back() -> None:
    """The worker stops (its runner's task is cancelled) while a job waits for its
    share: the job goes back on the queue without an attempt, as from training, and
    the fleet holds nothing for it."""
    ft, queue, _, _ = setup()
    fleet = await busy_fleet()
    runner = never_room(ft, queue, fleet)
    j = await job(ft)
    task = asyncio.ensure_future(runner.run())

    await async_wait_for(lambda: waits(ft, j), 10)
    task.cancel()  # a wait that swallowed the cancel would leave the runner running
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
    back = await ft.job(OPEN, j.id)
    assert back.status is JobStatus.QUEUED and back.attempts == 0 and back.owner is None
    assert "the worker stopped; job queued again" in await feed(ft, j)
    assert fleet.used() == 60 << 20  # the busy model's, and no share


async def test_a_job_taken_up_again_says_its_attempt_with_or_without_a_checkpoint() -> None:
    """A job whose trainer died before its first checkpoint is started again from the
    beginning: the feed says which attempt it is. Before, only a resume said so, and a
    retry without a checkpoint read as a first start."""
    ft, queue, _, _ = setup()

    async def train(*args: object) -> object:
        raise Cancelled("cancelled while training")

    runner = JobRunner(ft.store, queue, runner_registry(ft), nowhere, train=train)  # type: ignore[arg-type]
    j = await job(ft)
    await ft.store.put_job((await ft.job(OPEN, j.id)).with_(attempts=1))  # one trainer died
    lease = await queue.take(1.0)
    assert lease is not None
    await asyncio.wait_for(runner.handle(lease), 10)
    said = await feed(ft, j)
    assert [m for m in said if m.startswith("training started")] == [
        "training started (attempt 2)"
    ], said


@pytest.mark.parametrize(
    ("miner", "words"),
    [
        ("absent", "needs its miner (train_miner): no weights for absent here"),
        ("reranker", "needs a dense bi-encoder to mine with; train_miner is 'reranker', "
                     "a cross_encoder model"),
        ("", "needs a dense bi-encoder to mine with; train_miner is ''"),
    ],
)  # fmt: skip
async def test_a_reranker_job_without_a_dense_miner_fails_naming_the_model(
    miner: str, words: str, tmp_path: Path
) -> None:
    """A cross-encoder base trains with ``train_miner``: one without weights here, or
    not a bi-encoder, fails the job before any training, saying which."""
    store = JobStore(AdapterStore(MemoryStore()))
    queue = MemoryJobQueue()
    ft = FineTuning(store, queue, {"reranker": "cross_encoder"}.get, TrainLimits(min_pairs=4))
    registry = AdapterRegistry(store.store, limits=Limits(), bases=StaticBases({}))

    async def base_of(model: str) -> TrainBase:
        if model == "absent":
            raise InvalidInput(f"no weights for {model} here", field="model")
        return TrainBase(str(tmp_path), "cls", False, 64, "cross_encoder")

    trained: list[TrainSpec] = []

    async def train(spec: TrainSpec, *_: object) -> TrainResult:
        trained.append(spec)
        raise AssertionError("no training without a miner")

    runner = JobRunner(store, queue, registry, base_of, train=train, miner=miner)
    f = await ft.create_file(OPEN, "p.jsonl", pairs())
    j = await ft.create_job(OPEN, {"model": "reranker", "training_file": f.id})
    lease = await queue.take(1.0)
    assert lease is not None
    await runner.handle(lease)
    done = await ft.job(OPEN, j.id)
    assert done.status is JobStatus.FAILED and done.error is not None
    assert done.error["field"] == "model" and words in done.error["message"], done.error
    assert trained == []
