"""The real path, in-process, for measuring a candidate: queue, worker, runner, runtime.

A :class:`Stack` serves one loaded adapter with one profile exactly as the embedded
server does (a ``MemoryQueue``, a ``Worker``, the family's runner and the process's
compute thread), minus the HTTP hop, which does not depend on the candidate. Loads
go to the queue as the gateway would put them there.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ...aio import cancel_and_wait
from ...catalog import ModelSpec, Profile
from ...families import AnyFamily
from ...gateway import envelope as env_mod
from ...metrics import Metrics
from ...queue import MemoryQueue
from ...wire import Encoding, FleetError, Task, error_from_body
from ...wire.codec import loads
from ...worker import ModelRunner, Worker
from ...worker.runner import Runner
from ..loadgen import percentile
from . import pauses as pauses_mod
from .slow import within

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One request of a workload: its task, JSON body and real tokens (for tokens/s)."""

    task: Task
    body: bytes
    tokens: int
    items: int


@dataclass(frozen=True)
class Measure:
    tokens_per_s: float
    items_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    seconds: float  # the window's, its pauses included
    paused_s: float = 0.0  # of which a background tune's server held it stopped
    warm_s: float = 0.0  # its first two requests, one at a time (pauses left out)


class Stack:
    """``async with Stack(spec, profile, adapter) as s: await s.send(request)``.

    ``adapter`` is not loaded yet: entering the stack loads it as the worker would."""

    def __init__(self, spec: ModelSpec, profile: Profile, adapter: AnyFamily) -> None:
        self.spec = spec
        self.metrics = Metrics()
        self.queue = MemoryQueue(max_depth=1 << 16)
        runner: Runner
        if spec.family == "generate":
            from ...worker.gen_runner import GenerationRunner

            runner = GenerationRunner(spec, profile, adapter, self.metrics, eager=True)
        else:
            runner = ModelRunner(spec, profile, adapter, self.metrics, eager=True)
        self.runner = runner
        self.worker = Worker(self.queue, {spec.id: runner}, self.metrics)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Stack:
        await self.runner.load()  # on the compute thread, with its warm-up, as served
        await self.queue.start()
        self._task = asyncio.create_task(self.worker.run(), name="tune-worker")
        while not self.worker.running:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.001)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self.queue.close()
        self.worker.close()

    @property
    def family(self) -> AnyFamily:
        return self.runner.family

    async def compute(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` on the compute thread (where every forward runs)."""
        from ...worker.compute import compute_executor

        return await asyncio.get_running_loop().run_in_executor(compute_executor(), fn, *args)

    async def send(self, req: Request, timeout: float = 600.0) -> int:
        """Publish ``req``, wait for its reply and return its tokens; a failed reply
        raises its error. A request of ``tokens < 0`` counts the completion tokens."""
        env = env_mod.build(
            model=self.spec.id,
            task=req.task,
            content_type=Encoding.JSON,
            accept=Encoding.MSGPACK,  # as the SDK asks: arrays as raw bytes, cheap to encode
            body_size=len(req.body),
            timeout=timeout,
            request_id=None,
            tenant=None,
        )
        pending = await self.queue.publish(env, req.body)
        reply = await pending.wait(timeout)
        if reply.error is not None:
            raise error_from_body(reply.error)
        if req.tokens >= 0:
            return req.tokens
        return int(loads(reply.body, Encoding.MSGPACK)["usage"]["completion_tokens"])


async def saturate(
    stack: Stack,
    requests: Sequence[Request],
    clients: int,
    duration: float,
    warmup_s: float = 0.0,
    pauses: pauses_mod.Read = pauses_mod.never,
    warm_limit: float | None = None,
) -> Measure:
    """``clients`` closed-loop clients sending back to back for ``duration`` seconds,
    after ``warmup_s`` seconds of the same traffic that is not measured (the shapes,
    allocations and thread pools of concurrent batches, not only of lone requests).

    ``pauses``: a background tune's ledger. The seconds its server held this process
    stopped leave the window (it runs ``duration`` seconds of its own, and the work
    done is divided by the time it ran), and a request a pause cut into leaves the
    latencies (they would hold the stop): a window traffic interrupts still measures,
    however often it is interrupted.

    ``warm_limit``: the seconds the first two requests, sent one at a time, may take;
    a TooLong once past it (a candidate far slower than the reference)."""
    lat: list[float] = []
    tokens = items = errors = done = 0
    counter = 0

    async def warm() -> None:  # the path (and its shapes)
        for r in requests[: min(2, len(requests))]:
            await stack.send(r)

    paused_w, t_warm = pauses().seconds, time.perf_counter()
    if warm_limit is None:
        await warm()
    else:
        await within(warm(), warm_limit, pauses, "its two warm requests")
    warm_s = time.perf_counter() - t_warm - (pauses().seconds - paused_w)
    if warmup_s > 0:
        await saturate(stack, requests, clients, warmup_s)
    paused0 = pauses().seconds
    t_begin = time.perf_counter()

    def going() -> bool:  # until it has run ``duration`` seconds, its pauses left out
        return time.perf_counter() < t_begin + duration + pauses().seconds - paused0

    async def client() -> None:
        nonlocal tokens, items, errors, counter, done
        while going():
            req = requests[counter % len(requests)]
            counter += 1
            t0, cuts = time.perf_counter(), pauses().count
            try:
                got = await stack.send(req)
            except FleetError:
                errors += 1
                continue
            if pauses().count == cuts:  # no pause cut into it
                lat.append(time.perf_counter() - t0)
            done += 1
            tokens += got
            items += req.items

    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - t_begin
    paused = max(0.0, pauses().seconds - paused0)
    ran = max(elapsed - paused, 1e-6)
    return Measure(
        tokens_per_s=tokens / ran,
        items_per_s=items / ran,
        p50_ms=statistics.median(lat) * 1e3 if lat else float("nan"),
        p99_ms=percentile(lat, 0.99) * 1e3 if lat else float("nan"),
        requests=done,
        errors=errors,
        seconds=elapsed,
        paused_s=paused,
        warm_s=warm_s,
    )


def summary(values: Sequence[float]) -> dict[str, object]:
    """Median and relative spread ((max - min) / median) of repeated figures."""
    med = statistics.median(values)
    spread = (max(values) - min(values)) / med if med else 0.0
    return {"median": med, "spread": spread, "n": len(values)}


__all__ = ["Measure", "Request", "Stack", "saturate", "summary"]
