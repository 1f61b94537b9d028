"""The fleet on one device: which models are resident, within one memory budget.

Pinned models load at start and never leave. The others load on first use. Before a
load the manager makes room: it evicts by the policy (GDSF by default), never a pinned
model, one with work in flight or one inside its ``keep_alive``. When nothing can
leave it waits a little for work to finish, then answers 503 with Retry-After. A model
that fails to load is marked failed with the reason; its requests get that reason
until a cool-down passes, then the next one tries again. The rest keep serving. A
model swapped to a new profile loads it beside the served one (``worker.swap``).
Under pressure a model that can sleep does so before it is evicted: its weights leave
the memory budget for the host tier's (``host_tier.py``), and its next use wakes it.
The policy prices a resident model by what bringing it back would cost: a wake where
it would sleep, else a load (``Room.price``). Making room, evicting and holding bytes
beside the models are ``room.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from ..metrics import Metrics
from ..wire import Unavailable
from .drift import Drift
from .member import Footprint, Member, State, is_oom
from .policy import Policy, Resident
from .room import Room
from .slot import NOTHING, Slot
from .slots import Slots
from .swaps import Swaps

log = logging.getLogger("fleetserve.fleet")
MIB = 1 << 20


class Fleet:
    """Admission, loading and eviction for the models of one device."""

    def __init__(
        self,
        budget: int,
        policy: Policy,
        *,
        metrics: Metrics | None = None,
        cooldown: float = 30.0,
        room_wait: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        trim: Callable[[], None] = lambda: None,
        budget_now: Callable[[], int] | None = None,
        actual: Callable[[], int] | None = None,
        host_budget: int = 0,
    ) -> None:
        """``budget_now``: the budget as it changes (the default budget's share of the
        host, ``HostShare.budget``), looked at before each load; None: ``budget``.
        ``host_budget``: bytes of sleeping models' weights the host tier holds (0:
        none sleeps; evicted models unload).
        ``actual``: what the process holds now (its resident set; the device's memory
        on a GPU), checked against the charge at each load, over the interval since
        the last check, evictions included (``drift.py``); None: not checked."""
        self.policy = policy
        self.metrics = metrics
        self.cooldown = cooldown  # before a failed model's load is retried
        self.clock = clock
        self._trim = trim
        self._slots = Slots()
        self.room = Room(
            self._slots, budget, policy, metrics=metrics, cooldown=cooldown,
            room_wait=room_wait, clock=clock, trim=trim, budget_now=budget_now,
            host_budget=host_budget,
        )  # fmt: skip
        self._pressed = asyncio.Lock()  # one load at a time among those that must evict
        self.drift = Drift(actual, metrics) if actual is not None else None
        self.swaps = Swaps(self._slots, self.room)  # a new profile beside the served one
        if metrics is not None:
            metrics.memory_budget.set(budget)
            metrics.host_tier_budget.set(host_budget)

    @property
    def budget(self) -> int:
        """The memory budget's bytes now (``Room.rebudget``)."""
        return self.room.budget

    # -- membership and state ---------------------------------------------------
    def add(self, member: Member) -> None:
        self._slots[member.model_id] = Slot(member)

    def remove(self, model: str) -> None:
        """A hot remove, once its work has drained: unloaded if resident, then gone."""
        s = self._slots.get(model)
        if s is not None and s.record is not None:
            self.room.evict(s, "removed")
            self._trim()
        elif s is not None and s.state is State.SLEEPING:
            self.room.drop_sleeper(s, "removed")
        self._slots.pop(model, None)
        self.room.changed.set()
        self.room.gauges()

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def state(self, model: str) -> State:
        return self._slots[model].state

    def used(self) -> int:
        """Bytes held (``Room.used``)."""
        return self.room.used()

    def pinned_bytes(self) -> dict[str, int]:
        """What each pinned model holds alone, or is expected to before it loads."""
        return self._slots.pinned_bytes()

    def check_budget(self) -> None:
        """Start-up: the pinned models must fit in the budget (a one-line ValueError)."""
        pinned = self.pinned_bytes()
        total = self.room.pinned_need()
        if total > self.budget:
            parts = ", ".join(f"{m} {b / MIB:.1f} MiB" for m, b in pinned.items())
            raise ValueError(
                f"--memory-budget {self.budget / MIB:.1f} MiB is below the pinned models' "
                f"total {total / MIB:.1f} MiB ({parts})"
            )

    def memory(self) -> dict[str, int]:
        """The budgets and what is held against them: the models' (``used``), and the
        host tier's (the weights of sleeping models)."""
        return {
            "budget": self.budget, "used": self.used(),
            "host_tier_budget": self.room.host.budget, "host_tier_used": self.room.host.used,
            "sleeping": len(self.room.host),
        }  # fmt: skip

    def info(self, model: str) -> dict[str, Any]:
        s = self._slots[model]
        failed = s.state is State.FAILED
        return {
            "state": s.state.value,
            "bytes": self._slots.footprint(s).total,
            "pinned": s.member.pinned,
            "keep_alive": s.member.keep_alive,
            "kept_alive_s": round(self.kept_alive(model), 1),
            "error": s.error.message if failed and s.error is not None else None,
            "inflight": s.inflight,
        }

    # -- admission ----------------------------------------------------------------
    def try_acquire(self, model: str, keep_alive: float | None = None) -> bool:
        """The fast path: take a use of ``model`` if it is resident."""
        s = self._slots[model]
        if s.state is not State.RESIDENT:
            return False
        self._use(s, keep_alive)
        return True

    async def acquire(
        self, model: str, *, timeout: float, keep_alive: float | None = None, wait: bool = True
    ) -> None:
        """Make ``model`` resident and take a use of it (``release`` gives it back).

        ``timeout`` bounds the wait, in seconds (the request's deadline): for a load
        under way, and (with ``wait``) for room while busy models finish. ``wait=False``
        (a shared queue, where another worker may serve the request) does not wait for
        room: the request can go back to the queue.
        Raises a ``FleetError``: the model's own failure, or ``Unavailable`` with
        Retry-After when there is no room.
        """
        s = self._slots[model]
        deadline = self.clock() + timeout
        if s.state is not State.RESIDENT and self.metrics is not None:
            self.metrics.misses.labels(model).inc()
        while True:
            if s.state is State.RESIDENT:
                self._use(s, keep_alive)
                return
            self._raise_failure(s)
            try:
                await asyncio.wait_for(s.lock.acquire(), max(0.0, deadline - self.clock()))
            except TimeoutError:
                raise Unavailable(f"model {model!r} is still loading", retry_after=1.0) from None
            try:
                if s.no_room is not None and self.clock() < s.no_room_until:
                    raise s.no_room.fresh()  # the attempt just before ours found none
                if s.state in (State.COLD, State.LOADING, State.SLEEPING) or (
                    s.state is State.FAILED and s.failed_at + self.cooldown <= self.clock()
                ):
                    await self._load(s, deadline, wait)
            finally:
                s.lock.release()

    def failed(self, model: str) -> bool:
        """``model`` failed to load and its cool-down has not passed."""
        s = self._slots[model]
        return s.state is State.FAILED and s.failed_at + self.cooldown > self.clock()

    def _raise_failure(self, s: Slot) -> None:
        """Inside its cool-down, a failed model's reason, with the time left to wait."""
        left = s.failed_at + self.cooldown - self.clock()
        if s.state is State.FAILED and s.error is not None and left > 0:
            raise s.error.fresh(retry_after=max(1.0, round(left)))

    def release(self, model: str) -> None:
        if self._slots[model].give():
            self.room.changed.set()

    def _use(self, s: Slot, keep_alive: float | None) -> None:
        now = self.clock()
        s.take()
        r = s.record
        assert r is not None
        r.last_used = now
        keep = s.member.keep_alive if keep_alive is None else keep_alive
        r.keep_until = max(r.keep_until, now + keep)
        r.reload_s = self.room.price(s, r.bytes, r.reload_s)  # (a wake seen since)
        self.policy.used(r, now)

    # -- loading and making room --------------------------------------------------
    async def _load(self, s: Slot, deadline: float, wait: bool) -> None:
        """Load (or wake) ``s``. A load that must evict to fit waits for the one before
        it that had to: loads at once each reserved their room, and evicted models that
        the next request wanted back. On a 16-model trace with 4 clients (1,000
        requests, a budget of half of what the models hold, 2-core cpu-avx2) this made
        74 and 78 loads (gdsf, lru) where all at once made 94 and 98, and 22.0 and
        22.7 s of loading against 31.8 and 30.8, p99 about the same. A load that fits,
        and a wake, run at once (every load one at a time made 48 and 65 loads, but
        would hold a model that fits behind a long conversion); so does one that may
        not wait (``wait=False``: its request can go back to a shared queue). The wait
        ends at ``deadline``: 503, Retry-After."""
        self.room.rebudget()
        need = s.measured or s.member.expected()
        loading = need.loading()
        fits = loading.kept <= self.room.free_without((), loading.peak)
        if s.state is State.SLEEPING or fits or not wait:
            await self._load_now(s, need, deadline, wait)
            return
        try:
            await asyncio.wait_for(self._pressed.acquire(), max(0.0, deadline - self.clock()))
        except TimeoutError:
            raise Unavailable(
                f"model {s.member.model_id!r} waits for room: another load is making room",
                retry_after=1.0,
            ) from None
        try:
            await self._load_now(s, need, deadline, wait)
        finally:
            self._pressed.release()

    async def _load_now(self, s: Slot, need: Footprint, deadline: float, wait: bool) -> None:
        model, loading = s.member.model_id, need.loading()
        try:
            await self.room.make(model, loading, deadline, wait)
        except Unavailable as err:  # the requests queued behind this one need not wait too
            s.no_room, s.no_room_until = err, self.clock() + 1.0
            raise
        woken = s.state is State.SLEEPING and self.room.host.remove(model)
        s.state, s.held, s.error = State.LOADING, loading, None
        self.room.gauges()
        already = s.member.loaded  # taken over loaded (the tuner's fleets): no load to log
        t0 = self.clock()  # the injected clock: a load's cost is what eviction weighs
        try:
            got = await self._load_once(s)
            if got is None:  # out of memory: others evicted; the failed try is let go
                log.warning("%s: out of memory while loading; evicted others, retrying", model)
                got = await s.member.load()
        except BaseException as exc:  # cancelled too: never left loading
            self._failed(s, exc)
            if not isinstance(exc, Exception):
                raise
            assert s.error is not None
            raise s.error.fresh() from None
        finally:
            self.room.changed.set()
        now = self.clock()
        dt = now - t0
        s.state, s.held, s.measured = State.RESIDENT, got, got
        if woken:  # (a wake that failed loaded it: its seconds are not a load's either)
            s.wake_s = dt
            self.room.wake_per_byte = dt / max(got.kept, 1)
        else:
            s.load_s = dt
        log.log(
            logging.DEBUG if already else logging.INFO,
            "%s %s in %.1fs (%.1f MiB)%s", "woke" if woken else "loaded",
            model, dt, got.total / MIB, " (it was loaded already)" if already else "",
        )  # fmt: skip
        cost = self.room.price(s, got.kept, dt)
        s.record = Resident(model, got.kept, cost, pinned=s.member.pinned, last_used=now)
        self.policy.loaded(s.record, now)  # the request that loaded it is used in _use
        if self.metrics is not None:
            self.metrics.loads.labels(model, "woken" if woken else "ok").inc()
            self.metrics.load_seconds.labels(model).observe(dt)
        self.room.gauges()
        if not already:
            self._check("load", model, got.weights)
        if got.total > need.total and self.used() > self.budget:
            log.info(
                "%s holds %.1f MiB, more than the %.1f MiB expected",
                model, got.total / MIB, need.total / MIB,
            )  # fmt: skip
            await self.room.shed(model)

    async def _load_once(self, s: Slot) -> Footprint | None:
        """One load; ``None`` after an out-of-memory error that evicting others may cure
        (the error's frames, which hold what the try had allocated, are cleared)."""
        try:
            return await s.member.load()
        except Exception as exc:
            if not is_oom(exc):
                raise
            traceback.clear_frames(exc.__traceback__)
            oom = exc
        del oom
        if await self.room.evict_all(s.member.model_id, "oom"):
            return None
        raise MemoryError(f"out of memory loading {s.member.model_id!r}; nothing left to evict")

    async def room_beside(self, model: str, nbytes: int) -> None:
        """Room for ``nbytes`` more held for resident ``model`` (its torch copy for
        adapter batches), made as for a load: others are evicted by the policy, never
        ``model`` itself, and a busy one is waited for within ``room_wait``. The caller
        charges the bytes (``adapters``) before it awaits anything else."""
        s = self._slots[model]
        if s.record is None:
            raise Unavailable(f"model {model!r} is not resident", retry_after=1.0)
        s.take()  # it is what the room is for
        try:
            await self.room.make(model, Footprint(nbytes), self.clock() + self.room.room_wait, True)
        finally:
            self.release(model)

    def release_keep_alive(self, model: str) -> float:
        """An admin ends ``model``'s keep-alive: it may leave under pressure now (once idle).
        The seconds it had left (0: none); a load waiting for room looks again."""
        r = self._slots[model].record
        if r is None:
            return 0.0
        left = max(0.0, r.keep_until - self.clock())
        r.keep_until = 0.0
        for s in self._slots.values():  # those just refused for want of room try again
            s.no_room, s.no_room_until = None, 0.0
        self.room.changed.set()
        if left:
            log.info("%s: keep-alive released (%.0fs were left)", model, left)
        return left

    def kept_alive(self, model: str) -> float:
        """Seconds ``model`` stays kept alive (0: none, or not resident)."""
        r = self._slots[model].record
        return 0.0 if r is None else max(0.0, r.keep_until - self.clock())

    async def relieve(self, model: str) -> bool:
        """An out-of-memory error in ``model``'s batch: make room by evicting others."""
        return await self.room.evict_all(model, "oom")

    def _failed(self, s: Slot, exc: BaseException) -> None:
        """Remember why ``s`` failed (``Slot.fail``); cancelled: cold again."""
        model = s.member.model_id
        if not isinstance(exc, Exception):  # cancelled: cold again, nothing to remember
            s.state, s.held = State.COLD, NOTHING
            self.room.gauges()
            return
        with_reason = s.fail(exc, self.clock(), self.cooldown)
        log.warning("%s failed to load: %s", model, with_reason.message)
        if self.metrics is not None:
            self.metrics.loads.labels(model, "failed").inc()
        self.room.gauges()

    def _check(self, event: str, model: str, moved: int) -> None:
        """The charge for weights (and the hot adapters) against what the process holds
        (``drift.py``), unless a load is under way (it holds part of its reservation
        only). The state models serve with (KV caches) is held only while they run:
        the slack either way."""
        if self.drift is not None and not self._slots.loading():
            moved, self.room.evicted = moved + self.room.evicted, 0
            charged = self._slots.weights() + self.room.adapters()
            self.drift.check(event, model, charged, moved, self._slots.states())
            self.room.retain(self.drift.unaccounted)


__all__ = ["Fleet", "Member", "State", "is_oom"]
