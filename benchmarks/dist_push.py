"""A push router for the pull-versus-push benchmark: the same gateway, other assignment.

Each worker pulls from its own queue prefix (its own stream), so it only ever sees
what the router sent it. :class:`PushQueue` is the gateway's WorkQueue: ``publish``
picks one worker's queue (round-robin, or the fewest requests this router has in
flight there) and delegates to it. Transport, envelope and offload are the gateway's.

``python -m benchmarks dist router --prefixes push-w0,push-w1 --policy lor --nats URL``
runs it as a process with the gateway's HTTP API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from fleetserve.queue import Message, PendingReply, QueueStats, WorkQueue
from fleetserve.queue.cancels import CancelListener
from fleetserve.settings import Settings
from fleetserve.wire import Envelope, Reply

POLICIES = {"rr": "round-robin", "lor": "least outstanding requests"}


class _Tracked:
    """A pending reply that tells the router once when its request is over."""

    def __init__(self, inner: PendingReply, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release = release
        self._released = False

    async def wait(self, timeout: float) -> Reply:
        try:
            return await self._inner.wait(timeout)
        finally:
            self._done()

    async def stream(self, timeout: float) -> AsyncGenerator[Reply, None]:
        try:
            async for reply in self._inner.stream(timeout):
                yield reply
        finally:
            self._done()

    def cancel(self) -> None:
        self._inner.cancel()
        self._done()

    def _done(self) -> None:
        if not self._released:
            self._released = True
            self._release()


class PushQueue:
    """The gateway side of a push router over N per-worker queues."""

    def __init__(self, queues: Sequence[WorkQueue], policy: str = "rr") -> None:
        if not queues:
            raise ValueError("a push router needs at least one worker queue")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.queues = list(queues)
        self.policy = policy
        self.outstanding = [0] * len(self.queues)  # this router's requests in flight
        self.sent = [0] * len(self.queues)
        self.stats = QueueStats()
        self._next = 0

    def choose(self) -> int:
        """The worker for the next request. Least-outstanding breaks ties round-robin."""
        n = len(self.queues)
        if self.policy == "rr":
            i = self._next
        else:
            i = min(range(n), key=lambda k: (self.outstanding[k], (k - self._next) % n))
        self._next = (i + 1) % n
        return i

    async def publish(
        self, envelope: Envelope, body: bytes, payload: str | None = None
    ) -> PendingReply:
        i = self.choose()
        self.outstanding[i] += 1
        try:
            pending = await self.queues[i].publish(envelope, body, payload)
        except BaseException:
            self.outstanding[i] -= 1
            raise
        self.sent[i] += 1
        return _Tracked(pending, lambda: self._release(i))

    def _release(self, i: int) -> None:
        self.outstanding[i] -= 1

    async def start(self) -> None:
        for q in self.queues:
            await q.start()

    async def close(self) -> None:
        for q in self.queues:
            await q.close()

    @property
    def healthy(self) -> bool:
        return all(q.healthy for q in self.queues)

    def depth(self, model: str) -> int:
        return sum(q.depth(model) for q in self.queues)

    async def refresh(self, models: Sequence[str]) -> None:
        for q in self.queues:
            await q.refresh(models)

    # -- a router only publishes: the worker side belongs to the workers' queues --------
    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        raise NotImplementedError("a push router does not pull")

    async def ack(self, msg: Message) -> None:
        raise NotImplementedError("a push router does not settle messages")

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        raise NotImplementedError("a push router does not settle messages")

    async def touch(self, msg: Message) -> None:
        raise NotImplementedError("a push router does not settle messages")

    async def term(self, msg: Message) -> None:
        raise NotImplementedError("a push router does not settle messages")

    async def dead_letter(self, msg: Message, reason: str) -> None:
        raise NotImplementedError("a push router does not settle messages")

    async def reply(self, msg: Message, reply: Reply) -> None:
        raise NotImplementedError("a push router does not reply")

    async def cancel(self, request_id: str, until: float) -> None:
        for q in self.queues:  # only the one it went to holds it; the others drop it
            await q.cancel(request_id, until)

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        raise NotImplementedError("a push router does not hear cancels: workers do")


async def serve_router(settings: Settings, prefixes: Sequence[str], policy: str) -> None:
    """The gateway's HTTP API over a PushQueue: one JetStream queue per worker prefix."""
    from fleetserve.assembly import build_catalog
    from fleetserve.gateway import Gateway
    from fleetserve.gateway.wiring import Hooks
    from fleetserve.lifecycle import start_http
    from fleetserve.metrics import Metrics
    from fleetserve.queue.factory import open_distributed

    sys.setswitchinterval(settings.gil_switch_interval)
    conns: list[Any] = []
    queues: list[WorkQueue] = []
    http: Any = None
    try:
        for i, prefix in enumerate(prefixes):
            node = f"router-{policy}-{i}-{os.getpid()}"
            js, queue, _ = await open_distributed(
                dataclasses.replace(settings, queue_prefix=prefix), node
            )
            conns.append(js)
            queues.append(queue)
        push = PushQueue(queues, policy)
        gateway = Gateway(
            settings,
            build_catalog(settings),
            push,
            Metrics(),
            hooks=Hooks(ready=lambda: push.healthy),
        )
        http, task, port = await start_http(gateway, settings.host, settings.port)
        print(f"push router ({POLICIES[policy]}) on http://{settings.host}:{port}", flush=True)
        await task
    finally:
        if http is not None:
            http.should_exit = True
        for js in conns:
            await js.close()


def router_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks dist router", description=__doc__)
    p.add_argument("--prefixes", required=True, help="comma-separated worker queue prefixes")
    p.add_argument("--policy", choices=sorted(POLICIES), default="rr")
    Settings.add_arguments(p)
    args = vars(p.parse_args(list(argv)))
    prefixes = [x for x in args.pop("prefixes").split(",") if x]
    policy = args.pop("policy")
    settings = Settings.load(cli=args)  # flags only: the bench passes everything explicitly
    logging.basicConfig(level=settings.log_level.upper())
    import uvloop

    return int(uvloop.run(_until_signal(serve_router(settings, prefixes, policy))) or 0)


async def _until_signal(main: Any) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await main
    return 0
