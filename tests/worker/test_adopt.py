"""A runner adopting a new profile (``Loadable.adopt``) while a batch is in flight:
the batch finishes on the adapter it started with, the next runs on the new one."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import types
from typing import Any

from fleetserve.catalog import ModelSpec
from fleetserve.families import Prepared
from fleetserve.metrics import Metrics
from fleetserve.queue import Message
from fleetserve.wire import FleetError, Task
from fleetserve.worker import ModelRunner
from fleetserve.worker.batcher import Job

from ..fleet.test_swap import NEW, OLD, compute_held, request_envelope
from ..sinks import CallbackSink


class Tagged:
    """A family whose rows say which adapter ran them."""

    tasks = frozenset({Task.ENCODE})

    def __init__(self, name: str) -> None:
        self.name = name
        self.runtime: Any = types.SimpleNamespace(name="tagged", precision="fp32")

    def load(self) -> None: ...

    def warmup(self) -> None: ...

    def memory_bytes(self) -> int:
        return 1

    def preprocess(self, envelope: Any, body: bytes) -> Prepared[list[int], None]:
        return Prepared(items=[[1, 2], [3]], options=None, tokens=3)

    def forward(self, items: Any) -> list[str]:
        return [self.name] * len(items)

    def postprocess(self, envelope: Any, prepared: Any, outputs: Any) -> bytes:
        return b""


async def test_a_batch_started_before_the_swap_finishes_on_the_old_adapter() -> None:
    spec = ModelSpec(id="swap/tagged", family="dense", runtime="torch", sources=("/none",))
    old = ModelRunner(spec, OLD.profile, Tagged("old"), Metrics())
    new = ModelRunner(spec, NEW.profile, Tagged("new"), Metrics())
    old.loaded = new.loaded = True
    done: dict[str, asyncio.Future[Job]] = {}

    def submit(rid: str) -> None:
        env = dataclasses.replace(request_envelope(spec.id, b""), request_id=rid)
        done[rid] = asyncio.get_running_loop().create_future()
        old.submit(Job(Message(env, b"", 1), old.family.preprocess(env, b""), time.time()))

    def finish(job: Job) -> None:
        done[job.msg.envelope.request_id].set_result(job)

    async def failed(job: Job, err: FleetError) -> None:
        done[job.msg.envelope.request_id].set_exception(err)

    task = asyncio.create_task(old.run(CallbackSink(finish, failed)))
    try:
        with compute_held():  # the batch waits for the compute thread, already given its adapter
            submit("r1")
            while len(old.waiting):  # taken, then handed to the compute thread at once
                await asyncio.sleep(0)
            old.adopt(new)
        assert (await asyncio.wait_for(done["r1"], 60)).outputs == ["old", "old"]
        submit("r2")
        assert (await asyncio.wait_for(done["r2"], 60)).outputs == ["new", "new"]
        assert old.waiting.max_batch_tokens == NEW.profile.max_batch_tokens
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_refigure_takes_the_profiles_figures_and_keeps_the_adapter() -> None:
    from fleetserve.catalog.spec import CostModel

    spec = ModelSpec(id="swap/tagged", family="dense", runtime="torch", sources=("/none",))
    old = ModelRunner(spec, OLD.profile, Tagged("old"), Metrics())
    tuned = dataclasses.replace(
        OLD.profile, cost=CostModel(0.5, 0.0, 0.002), memory_bytes=123, priority_cap=64
    )
    new = ModelRunner(spec, tuned, Tagged("new"), Metrics(), interactive_tokens=64)
    old.loaded, adapter = True, old.family
    old.refigure(new)
    assert old.profile == tuned
    assert old.family is adapter  # what runs stays
    assert old.waiting.interactive_tokens == 64
    old.unload()
    assert old.profile == tuned  # and what an unload goes back to
