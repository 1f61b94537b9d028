"""The worker's ledger ends each message it holds exactly once, whatever happens to it.

Random runs of pulls, loads, adapter heats, batches, chunks, answers, failures,
crashes, deadlines, cancels and put-backs go through a real ``Ledger`` and
``Canceller`` over a queue that records every ending; then the worker fails and
gives back what is left. Each message must end once (ack, nak, term or dead letter),
nothing is sent after its ending, and no use of a model or count goes negative.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, defaultdict
from collections.abc import Coroutine, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetserve.families import Prepared
from fleetserve.metrics import Metrics
from fleetserve.queue import Message
from fleetserve.queue.cancels import Cancel
from fleetserve.tracing import NULL_TRACER
from fleetserve.wire import Encoding, Envelope, InternalError, Reply, Task, Unavailable
from fleetserve.worker.batcher import Job
from fleetserve.worker.cancel import Canceller
from fleetserve.worker.ledger import Ledger
from fleetserve.worker.parts import Parts
from fleetserve.worker.records import Record, State

ENDINGS = ("ack", "nak", "term", "dead_letter")
_ids = itertools.count(1)


class Recorder:
    """A queue that records what happens to each message (by delivery id) and fails
    the run at once if anything comes after a message's ending."""

    def __init__(self) -> None:
        self.log: dict[int, list[str]] = defaultdict(list)
        self.broken: list[str] = []

    def _add(self, msg: Message, what: str) -> None:
        seen = self.log[msg.delivery_id]
        if any(e in ENDINGS for e in seen):
            self.broken.append(f"message {msg.delivery_id}: {what} after {seen}")
        seen.append(what)

    async def pull(self, models: Sequence[str], budget: int, timeout: float) -> list[Message]:
        return []

    async def reply(self, msg: Message, reply: Reply) -> None:
        self._add(msg, "chunk" if not reply.final else "reply")

    async def ack(self, msg: Message) -> None:
        self._add(msg, "ack")

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        self._add(msg, "nak")

    async def term(self, msg: Message) -> None:
        self._add(msg, "term")

    async def dead_letter(self, msg: Message, reason: str) -> None:
        self._add(msg, "dead_letter")

    async def touch(self, msg: Message) -> None:
        self._add(msg, "touch")


class Uses:
    """The fleet's uses of each model: taken before a job opens, given back once."""

    def __init__(self) -> None:
        self.held: Counter[str] = Counter()
        self.negative = False

    def take(self, model: str) -> None:
        self.held[model] += 1

    def release(self, model: str) -> None:
        self.held[model] -= 1
        self.negative |= self.held[model] < 0

    async def relieve(self, model: str) -> bool:
        return False


class Run:
    """One worker's ledger, driven by the steps of a drawn run."""

    def __init__(self) -> None:
        self.queue = Recorder()
        self.uses = Uses()
        self.tasks: list[asyncio.Task[None]] = []
        self.spawning = True
        self.ledger = Ledger(
            self.queue,
            Metrics(),
            NULL_TRACER,
            self.uses,
            Parts(self.queue, self.spawn),  # type: ignore[arg-type]  # it publishes nothing here
            self.spawn,
            self.postprocess,
            max_deliver=2,
        )
        self.cancels = Canceller(self.queue, Metrics(), self.ledger)  # type: ignore[arg-type]
        self.parked: list[Record] = []
        self.jobs: list[Job] = []
        self.finished: set[int] = set()  # a runner reports nothing of a job after its finish
        self.pulled: list[Message] = []

    def spawn(self) -> Any:
        if not self.spawning:
            raise RuntimeError("worker is not running")

        def start(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
            task = asyncio.get_running_loop().create_task(coro)
            self.tasks.append(task)
            return task

        return start

    async def postprocess(self, job: Job, done: float) -> None:
        await asyncio.sleep(0)  # other moves may come while it is postprocessed
        await self.ledger.reply(job, b"ok", {}, done)

    def message(self, attempts: int, expired: bool) -> Message:
        n = next(_ids)
        now = time.time()
        env = Envelope(
            request_id=f"r{n}",
            model="m",
            task=Task.ENCODE,
            content_type=Encoding.JSON,
            accept=Encoding.JSON,
            cost_hint=3,
            deadline=now - 1 if expired else now + 60,
            enqueued_at=now - 2,
        )
        msg = Message(env, b"", n, attempts=attempts)
        self.pulled.append(msg)
        return msg

    def open(self, msg: Message) -> None:
        self.uses.take(msg.envelope.model)
        self.jobs.append(self.ledger.open(msg, Prepared([[1, 2, 3]], None, 3), time.time()))

    async def step(self, op: str, i: int, flag: bool) -> None:
        job = self.jobs[i % len(self.jobs)] if self.jobs else None
        record = self.parked[i % len(self.parked)] if self.parked else None
        led = self.ledger
        if op == "pull":
            self.open(self.message(1 + i % 2, expired=False))
        elif op == "park":
            self.parked.append(led.park(self.message(1 + i % 2, expired=flag)))
        elif op == "loaded" and record is not None:
            self.parked.remove(record)
            if not led.unpark(record):
                return  # cancelled while parked: terminated by the canceller
            if record.msg.envelope.deadline < time.time():
                await led.drop(record.msg)
            else:
                self.open(record.msg)
        elif op == "load_failed" and record is not None:
            self.parked.remove(record)
            if led.unpark(record):
                err = Unavailable("no room", retry_after=1.0)
                await (led.put_back(record.msg, 1.0) if flag else led.answer(record.msg, err))
        elif op == "cancel" and (job is not None or record is not None):
            msg = job.msg if job is not None and (flag or record is None) else None
            msg = msg or (record.msg if record is not None else None)
            assert msg is not None
            self.cancels.heard(Cancel(msg.envelope.request_id, time.time() + 60))
        elif job is None or (op in ("chunk", "finish") and id(job) in self.finished):
            return
        elif op == "heat":
            led.heat(job)
        elif op == "heated":
            led.heated(job)
        elif op == "run":
            led.running(job)
        elif op == "chunk":
            if not job.settled:  # a runner drops settled jobs before it reports them
                led.chunk(job, b"c")
        elif op == "finish":
            if not job.settled:
                self.finished.add(id(job))
                led.finish(job)
        elif op == "fail":
            await led.fail(job, InternalError("failed"))
        elif op == "crash":
            await led.crash(job, InternalError("crashed"))
        elif op == "expire":
            await led.expire(job)
        elif op == "yield":
            for _ in range(1 + i % 3):
                await asyncio.sleep(0)
        self.check()

    def check(self) -> None:
        assert not self.queue.broken, self.queue.broken
        assert not self.uses.negative
        assert self.ledger.waiting_tokens() >= 0
        assert self.uses.held["m"] == len(self.ledger.jobs())  # each held job holds one use
        assert all(j.record.state is State.SETTLED for j in self.jobs if j.settled)

    async def settle_all(self, shared: bool) -> None:
        """Let what runs finish, then the worker fails: it gives back what it holds."""
        while pending := [t for t in self.tasks if not t.done()]:
            await asyncio.gather(*pending)
        self.spawning = False
        err = Unavailable("the worker failed; retry later", retry_after=1.0)
        await self.ledger.give_back(err, ["m"], shared)
        while pending := [t for t in self.tasks if not t.done()]:
            await asyncio.gather(*pending)


OPS = st.sampled_from(
    [
        "pull",
        "park",
        "loaded",
        "load_failed",
        "cancel",
        "heat",
        "heated",
        "run",
        "chunk",
        "finish",
        "fail",
        "crash",
        "expire",
        "yield",
    ]
)
STEPS = st.lists(st.tuples(OPS, st.integers(0, 7), st.booleans()), max_size=40)


async def drive(steps: list[tuple[str, int, bool]], shared: bool) -> Run:
    run = Run()
    for op, i, flag in steps:
        await run.step(op, i, flag)
    await run.settle_all(shared)
    run.check()
    return run


@settings(max_examples=300, deadline=None)
@given(steps=STEPS, shared=st.booleans())
def test_every_message_ends_exactly_once(steps: list[tuple[str, int, bool]], shared: bool) -> None:
    run = asyncio.run(drive(steps, shared))
    for msg in run.pulled:
        seen = run.queue.log[msg.delivery_id]
        endings = [e for e in seen if e in ENDINGS]
        assert len(endings) == 1, (msg.delivery_id, seen)
        assert seen.count("reply") <= 1 and seen.count("ack") <= 1
        if "reply" in seen:  # an answer is followed by its ack, or its dead letter
            assert endings[0] in ("ack", "dead_letter"), seen
    assert all(n == 0 for n in run.uses.held.values())
    assert run.ledger.jobs() == [] and run.ledger.parked() == [] and run.ledger.idle
    assert all(j.settled for j in run.jobs)


def test_a_crash_after_chunks_is_dead_lettered_not_retried() -> None:
    """A retry would repeat the chunks the client already had."""

    async def go() -> Run:
        run = Run()
        await run.step("pull", 0, False)  # attempts 1 of max_deliver 2: retryable
        await run.step("chunk", 0, False)
        await run.step("crash", 0, False)
        await run.settle_all(shared=True)
        return run

    run = asyncio.run(go())
    assert run.queue.log[run.pulled[0].delivery_id][-2:] == ["reply", "dead_letter"]


def test_a_cancel_while_it_heats_is_counted_as_loading() -> None:
    async def go() -> tuple[Run, Metrics]:
        run = Run()
        await run.step("pull", 0, False)
        await run.step("heat", 0, False)
        assert run.ledger.waiting_tokens() == 3 and not run.ledger.idle
        await run.step("cancel", 0, True)
        await run.settle_all(shared=False)
        return run, run.cancels.metrics

    run, metrics = asyncio.run(go())
    got = metrics.cancelled.labels("m", "loading")._value.get()
    assert got == 1 and run.queue.log[run.pulled[0].delivery_id] == ["term"]
