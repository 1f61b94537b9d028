"""The local queue's buffer: upstream messages waiting on this machine, oldest first.

Device processes ask with ``want`` (models, budget, timeout). One fetch loop pulls
upstream for everyone who waits, within the sum of their budgets: a long poll when
nothing here fits anyone, a quick top-up when something does. What arrives is handed
out first come, first served, interactive work first; what nobody took stays here for
the next who asks, and is kept alive upstream with ``touch``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Message, QueueStats, WorkQueue
from .sizing import choose

log = logging.getLogger("fleetserve.queue.local")
POLL = 0.5  # longest upstream long-poll, so that a new set of models is picked up soon
TOPUP = 0.002  # an upstream pull that only tops up what is already buffered here


@dataclass(eq=False, slots=True)
class Entry:
    msg: Message  # the upstream delivery
    seq: int  # arrival order here: lower is older
    attempts: int
    lid: int = 0  # the id a device process knows it by, new for each hand-out
    replied: bool = False
    tail: asyncio.Future[None] | None = None  # the last upstream operation on it

    @property
    def model(self) -> str:
        return self.msg.envelope.model


@dataclass(eq=False, slots=True)
class _Waiter:
    held: dict[int, Entry]  # where what it gets is recorded: its connection's
    models: set[str]
    budget: int
    until: float
    future: asyncio.Future[list[Entry]]
    interactive_only: bool = False


class LocalBuffer:
    def __init__(self, upstream: WorkQueue, age_limit: float = 2.0) -> None:
        self.upstream = upstream
        self.age_limit = age_limit  # seconds before batch work goes ahead of interactive
        self.stats = QueueStats()  # redeliveries here: NAKs and crashed devices
        self.entries: list[Entry] = []
        self.delayed: set[Entry] = set()  # NAK-ed with a delay: back soon
        self._waiters: list[_Waiter] = []
        self._demand = asyncio.Event()
        self._lids = itertools.count(1)
        self._seqs = itertools.count(1)
        self._polling = False

    def depth(self, model: str) -> int:
        """Waiting upstream plus waiting here."""
        return self.upstream.depth(model) + sum(1 for e in self.entries if e.model == model)

    async def want(
        self,
        held: dict[int, Entry],
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Entry]:
        """Up to ``budget`` (at least one message) within ``timeout``; recorded in ``held``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Entry]] = loop.create_future()
        until = loop.time() + timeout
        w = _Waiter(held, set(models), max(1, budget), until, fut, interactive_only)
        self._waiters.append(w)
        self._demand.set()
        if self._polling or timeout <= 0:  # the fetch loop is busy: serve from here now
            self.dispatch()
        try:
            if not fut.done() and timeout > 0:
                await asyncio.wait([fut], timeout=timeout)
        finally:
            if w in self._waiters:
                self._waiters.remove(w)
        got = fut.result() if fut.done() and not fut.cancelled() else []
        fut.cancel()
        return got

    def forget(self, held: dict[int, Entry]) -> None:
        """The connection that owns ``held`` is gone: its waits end empty."""
        for w in [w for w in self._waiters if w.held is held]:
            w.future.cancel()
            self._waiters.remove(w)

    async def fetch_forever(self) -> None:
        """Pull upstream for the devices that wait, within the sum of their budgets."""
        loop = asyncio.get_running_loop()
        failing = False
        while True:
            await self._demand.wait()
            self._waiters = [w for w in self._waiters if not w.future.done()]
            now = loop.time()
            live = [w for w in self._waiters if w.until > now]
            if not live:
                self._demand.clear()
                continue
            models = list(dict.fromkeys(m for w in live for m in sorted(w.models)))
            # devices whose formers are full take interactive work only: fetch only that
            # for them, and count only what some waiter can take
            only = all(w.interactive_only for w in live)
            here = sum(e.msg.envelope.cost_hint for e in self.entries if self._any_takes(live, e))
            short = sum(w.budget for w in live) - here
            servable = any(self._fits(w) for w in live)
            if short > 0:
                until = max(w.until for w in live)
                timeout = TOPUP if servable else min(POLL, max(until - loop.time(), 0.0))
                self._polling = not servable
                t0 = loop.time()
                try:
                    got = await self.upstream.pull(models, short, timeout, interactive_only=only)
                    failing = False
                except Exception as exc:  # disconnected: the upstream queue reconnects
                    (log.debug if failing else log.warning)("pulling upstream failed: %s", exc)
                    failing, got = True, []
                finally:
                    self._polling = False
                for m in got:
                    self.entries.append(Entry(m, next(self._seqs), m.attempts))
                if not got and not servable and loop.time() - t0 < timeout / 2:
                    await asyncio.sleep(0.5 if failing else 0.05)  # upstream is closed or down
            self.dispatch()
            await asyncio.sleep(0)

    async def touch_forever(self, every: float) -> None:
        """Keep what waits here alive upstream."""
        while True:
            await asyncio.sleep(every)
            for e in [*self.entries, *self.delayed]:
                try:
                    await self.upstream.touch(e.msg)
                except Exception as exc:
                    log.debug("touch failed: %s", exc)

    def _fits(self, w: _Waiter) -> bool:
        return any(_takes(w, e) for e in self.entries)

    @staticmethod
    def _any_takes(waiters: Sequence[_Waiter], e: Entry) -> bool:
        return any(_takes(w, e) for w in waiters)

    def dispatch(self) -> None:
        """Hand buffered work to the waiting devices, first come first served."""
        for w in list(self._waiters):
            if w.future.done():
                self._waiters.remove(w)
                continue
            got = self._take(w.models, w.budget, w.interactive_only)
            if got:
                for e in got:
                    e.lid = next(self._lids)
                    w.held[e.lid] = e
                w.future.set_result(got)
                self._waiters.remove(w)

    def _take(self, models: set[str], budget: int, interactive_only: bool = False) -> list[Entry]:
        mine = [  # in arrival order
            e
            for e in self.entries
            if e.model in models and (e.msg.envelope.interactive or not interactive_only)
        ]
        kept, _ = choose([e.msg.envelope for e in mine], budget, self.age_limit)
        taken = [mine[i] for i in kept]
        if taken:
            gone = set(map(id, taken))
            self.entries = [e for e in self.entries if id(e) not in gone]
        return taken

    def requeue(self, entries: Sequence[Entry]) -> None:
        """Back to the head, oldest first, attempts + 1."""
        for e in entries:
            e.attempts += 1
            self.stats.bump(self.stats.redeliveries, e.model)
        self.put_back(entries)

    def put_back(self, entries: Sequence[Entry]) -> None:
        if entries:
            self.entries[:0] = sorted(entries, key=lambda e: e.seq)
            self.dispatch()
            self._demand.set()

    def requeue_later(self, e: Entry, delay: float) -> None:
        e.attempts += 1
        self.stats.bump(self.stats.redeliveries, e.model)
        self.delayed.add(e)
        asyncio.get_running_loop().call_later(delay, self._back, e)

    def _back(self, e: Entry) -> None:
        if e in self.delayed:
            self.delayed.discard(e)
            self.put_back([e])

    def drain(self) -> list[Entry]:
        """Everything waiting here (to give back upstream)."""
        left = [*self.entries, *self.delayed]
        self.entries.clear()
        self.delayed.clear()
        return left


def _takes(w: _Waiter, e: Entry) -> bool:
    """Whether waiter ``w`` may be handed entry ``e``."""
    return e.model in w.models and (e.msg.envelope.interactive or not w.interactive_only)
