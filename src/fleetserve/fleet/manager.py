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
it would sleep, else a load (``eviction_cost``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from ..metrics import Metrics
from ..wire import Unavailable
from .drift import Drift
from .host_tier import HostTier
from .member import Footprint, Member, State, held_together, is_oom
from .policy import Policy, Resident, evictable, victims_until
from .room import no_room
from .slot import NOTHING, Slot
from .slots import Slots

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
        self.budget = self._shared = budget
        self._budget_now = budget_now
        self.policy = policy
        self.metrics = metrics
        self.cooldown = cooldown  # before a failed model's load is retried
        self.room_wait = room_wait  # how long a load may wait for busy models to finish
        self.clock = clock
        self._trim = trim
        self._slots = Slots()
        self.adapters: Callable[[], int] = lambda: 0  # bytes of the hot LoRA adapters
        self._room = asyncio.Lock()  # one making room at a time
        self._pressed = asyncio.Lock()  # one load at a time among those that must evict
        self._changed = asyncio.Event()  # work finished, a model left or loaded
        self.drift = Drift(actual, metrics) if actual is not None else None
        self._evicted = 0  # weights evicted since the last check (what the interval moved)
        self._wake_per_byte = 0.0  # the last wake's seconds per byte it brought back
        self.host = HostTier(host_budget, policy)
        if metrics is not None:
            metrics.memory_budget.set(budget)
            metrics.host_tier_budget.set(host_budget)

    # -- membership and state ---------------------------------------------------
    def add(self, member: Member) -> None:
        self._slots[member.model_id] = Slot(member)

    def remove(self, model: str) -> None:
        """A hot remove, once its work has drained: unloaded if resident, then gone."""
        s = self._slots.get(model)
        if s is not None and s.record is not None:
            self._evict(s, "removed")
            self._trim()
        elif s is not None and s.state is State.SLEEPING:
            self._drop_sleeper(s, "removed")
        self._slots.pop(model, None)
        self._changed.set()
        self._gauges()

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def state(self, model: str) -> State:
        return self._slots[model].state

    def used(self, extra: Footprint = NOTHING) -> int:
        """Bytes held (``Slots.held``: ``beside`` too), with ``extra`` added, and the
        hot adapters."""
        return self._slots.held(extra) + self.adapters()

    def _free_without(self, gone: Sequence[Resident], peak: int = 0) -> int:
        """The budget left were ``gone`` evicted, beside an activation ``peak``: their
        weights free, and their peaks where they were the largest."""
        leaving = {r.model for r in gone}
        return self.budget - self._slots.held(Footprint(0, peak), leaving) - self.adapters()

    def pinned_bytes(self) -> dict[str, int]:
        """What each pinned model holds alone, or is expected to before it loads."""
        return self._slots.pinned_bytes()

    def _pinned_need(self) -> int:
        """What the pinned models hold together, or will."""
        return held_together(self._slots.pinned())

    def check_budget(self) -> None:
        """Start-up: the pinned models must fit in the budget (a one-line ValueError)."""
        pinned = self.pinned_bytes()
        total = self._pinned_need()
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
            "host_tier_budget": self.host.budget, "host_tier_used": self.host.used,
            "sleeping": len(self.host),
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
        s = self._slots[model]
        s.inflight = max(0, s.inflight - 1)
        if s.record is not None:
            s.record.busy = s.inflight > 0
        if s.inflight == 0:
            self._changed.set()

    def _use(self, s: Slot, keep_alive: float | None) -> None:
        now = self.clock()
        s.inflight += 1
        r = s.record
        assert r is not None
        r.busy = True
        r.last_used = now
        keep = s.member.keep_alive if keep_alive is None else keep_alive
        r.keep_until = max(r.keep_until, now + keep)
        r.reload_s = self.eviction_cost(s, r.bytes, r.reload_s)  # (a wake seen since)
        self.policy.used(r, now)

    # -- loading and making room --------------------------------------------------
    def rebudget(self) -> None:
        """The budget as ``budget_now`` says (the host's share), looked at before a load."""
        if self._budget_now is not None and (now := self._budget_now()) != self._shared:
            self._shared = self.budget = now
            if self.metrics is not None:
                self.metrics.memory_budget.set(now)

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
        self.rebudget()
        need = s.measured or s.member.expected()
        loading = need.loading()
        fits = loading.kept <= self._free_without((), loading.peak)
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
        model = s.member.model_id
        try:
            await self._make_room(model, need.loading(), deadline, wait)
        except Unavailable as err:  # the requests queued behind this one need not wait too
            s.no_room, s.no_room_until = err, self.clock() + 1.0
            raise
        woken = s.state is State.SLEEPING and self.host.remove(model)
        s.state, s.held, s.error = State.LOADING, need.loading(), None
        self._gauges()
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
            self._changed.set()
        now = self.clock()
        dt = now - t0
        s.state, s.held, s.measured = State.RESIDENT, got, got
        if woken:  # (a wake that failed loaded it: its seconds are not a load's either)
            s.wake_s = dt
            self._wake_per_byte = dt / max(got.kept, 1)
        else:
            s.load_s = dt
        log.log(
            logging.DEBUG if already else logging.INFO,
            "%s %s in %.1fs (%.1f MiB)%s", "woke" if woken else "loaded",
            model, dt, got.total / MIB, " (it was loaded already)" if already else "",
        )  # fmt: skip
        cost = self.eviction_cost(s, got.kept, dt)
        s.record = Resident(model, got.kept, cost, pinned=s.member.pinned, last_used=now)
        self.policy.loaded(s.record, now)  # the request that loaded it is used in _use
        if self.metrics is not None:
            self.metrics.loads.labels(model, "woken" if woken else "ok").inc()
            self.metrics.load_seconds.labels(model).observe(dt)
        self._gauges()
        if not already:
            self._check("load", model, got.weights)
        if got.total > need.total and self.used() > self.budget:
            log.info(
                "%s holds %.1f MiB, more than the %.1f MiB expected",
                model, got.total / MIB, need.total / MIB,
            )  # fmt: skip
            await self._shed(model)

    def eviction_cost(self, s: Slot, kept: int, dt: float) -> float:
        """What evicting ``s`` would cost its next use, the price the policy weighs: a
        wake where it would sleep (its last wake's seconds; before its first, this
        fleet's last wake per byte times its ``kept`` bytes), else a load (its last's,
        or ``dt``, the seconds it just took). On a 16-model trace (2-core cpu-avx2) a
        torch model that sleeps first loaded in 0.4 to 0.7 s and woke in 3 to 20 ms:
        priced by its load, it outranked OpenVINO models that cannot sleep and reload
        in 0.2 to 0.4 s, and GDSF evicted those first."""
        if self.host.budget > 0 and s.member.sleeps:
            if s.wake_s:
                return s.wake_s
            if self._wake_per_byte:
                return self._wake_per_byte * kept
        return s.load_s or dt

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
        if await self._evict_all(s.member.model_id, "oom"):
            return None
        raise MemoryError(f"out of memory loading {s.member.model_id!r}; nothing left to evict")

    async def _make_room(self, model: str, need: Footprint, deadline: float, wait: bool) -> None:
        if held_together([*self._slots.pinned(but=model), need]) > self.budget:
            raise Unavailable(
                f"model {model!r} needs {need.total / MIB:.1f} MiB to load (its weights, "
                "what its load holds beside them and a batch's activations) but the memory budget "
                f"({self.budget / MIB:.1f} MiB) leaves "
                f"{(self.budget - self._pinned_need()) / MIB:.1f} MiB beside the pinned models",
                retry_after=self.cooldown,
            )
        give_up = min(deadline, self.clock() + (self.room_wait if wait else 0.0))
        while True:
            async with self._room:
                chosen = victims_until(
                    self.policy,
                    self._slots.records(),
                    lambda gone: need.kept <= self._free_without(gone, need.peak),
                    self.clock(),
                )
                if chosen is not None:
                    for r in chosen:
                        self._evict(self._slots[r.model], "pressure")
                    if chosen:
                        self._trim()
                    return
                self._changed.clear()
            left = give_up - self.clock()
            if left <= 0:
                free = self.budget - self.used(Footprint(0, need.peak))
                raise no_room(
                    model, (need.total, need.kept), self.budget, free, self._slots.records(),
                    lambda m: self._slots[m].held.total, self.clock(), self.cooldown,
                )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    # -- a new profile beside the served one (worker.swap) ------------------------
    @contextlib.asynccontextmanager
    async def holding(self, model: str) -> AsyncIterator[State]:
        """``model``'s slot for the block (no load of it starts) and, if resident, a use
        of it (it is not evicted, like one with work in flight); yields its state."""
        s = self._slots[model]
        async with s.lock:
            if s.state is State.SLEEPING:  # a new profile loads afresh
                self._drop_sleeper(s, "swap")
            r = s.record if s.state is State.RESIDENT else None
            if r is not None:
                s.inflight, r.busy = s.inflight + 1, True
            try:
                yield s.state
            finally:
                if r is not None:
                    self.release(model)

    async def reserve_beside(self, model: str, need: Footprint) -> Footprint:
        """Inside ``holding``: room for ``need`` beside resident ``model``, made as for a
        load (the policy evicts others) but never waited for (``Unavailable``), counted
        as ``model``'s until ``settle``. Returns what it held before."""
        s = self._slots[model]
        await self._make_room(model, need, self.clock(), wait=False)
        before = s.held  # nothing awaited since the room was found: it is still there
        s.held = Footprint(
            before.weights + need.weights, max(before.peak, need.peak), 0, before.state + need.state
        )
        self._gauges()
        return before

    async def room_beside(self, model: str, nbytes: int) -> None:
        """Room for ``nbytes`` more held for resident ``model`` (its torch copy for
        adapter batches), made as for a load: others are evicted by the policy, never
        ``model`` itself, and a busy one is waited for within ``room_wait``. The caller
        charges the bytes (``adapters``) before it awaits anything else."""
        s = self._slots[model]
        r = s.record
        if r is None:
            raise Unavailable(f"model {model!r} is not resident", retry_after=1.0)
        s.inflight, r.busy = s.inflight + 1, True  # it is what the room is for
        try:
            await self._make_room(model, Footprint(nbytes), self.clock() + self.room_wait, True)
        finally:
            self.release(model)

    @contextlib.asynccontextmanager
    async def beside(
        self, holder: str, nbytes: int, waiting: Callable[[], None] = lambda: None
    ) -> AsyncIterator[None]:
        """``nbytes`` of the budget held for ``holder`` (a training job's process) for
        the block. Room is made as for a load (the policy evicts idle models, never a
        pinned one) and waited for as long as it takes while busy or kept-alive models
        hold it (``waiting`` is called once, then). ``Unavailable`` at once where the
        pinned models leave too little."""
        left = self.budget - self._pinned_need()
        if nbytes > left:
            raise Unavailable(
                f"{holder} needs {nbytes / MIB:.1f} MiB of the memory budget "
                f"({self.budget / MIB:.1f} MiB), which leaves {left / MIB:.1f} MiB beside "
                "the pinned models",
                retry_after=self.cooldown,
            )
        told = False
        while True:
            self.rebudget()
            try:
                await self._make_room("", Footprint(nbytes), self.clock() + self.room_wait, True)
                break
            except Unavailable:
                if not told:
                    waiting()
                    told = True
                await self._changed.wait()  # work finished, a model left, a keep-alive ran out
        key, beside = holder, self._slots.beside
        while key in beside:  # two holds of one name stay two
            key += "'"
        beside[key] = nbytes  # nothing awaited since the room was found
        self._gauges()
        try:
            yield
        finally:
            del beside[key]
            self._changed.set()
            self._gauges()

    async def settle(self, model: str, held: Footprint | None) -> None:
        """Inside ``holding``, the swap over: resident ``model`` holds ``held`` (the new
        profile's, or what ``reserve_beside`` returned if none came); ``None``: it is not
        resident, and its next load makes room for its new profile's expected bytes."""
        s = self._slots[model]
        if held is None:
            s.measured = None
            return
        s.held = s.measured = held
        if s.record is not None:
            s.record.bytes = held.kept
        self._gauges()
        if self.used() > self.budget:  # it measured more than expected
            await self._shed(model)

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
        self._changed.set()
        if left:
            log.info("%s: keep-alive released (%.0fs were left)", model, left)
        return left

    def kept_alive(self, model: str) -> float:
        """Seconds ``model`` stays kept alive (0: none, or not resident)."""
        r = self._slots[model].record
        return 0.0 if r is None else max(0.0, r.keep_until - self.clock())

    def _evict(self, s: Slot, reason: str) -> None:
        """``s`` leaves the memory budget: asleep in the host tier where it can sleep
        (not when removed), else unloaded."""
        r = s.record
        model = s.member.model_id
        asleep = self.host.budget > 0 and reason != "removed" and s.member.sleep() > 0
        log.info(
            "%s %s (%.1f MiB, %s)", "sleeping" if asleep else "evicting", model,
            s.held.total / MIB, reason,
        )  # fmt: skip
        self._evicted += s.held.weights
        if not asleep:
            s.member.unload()
        if r is not None:
            self.policy.evicted(r)
        weights = s.held.weights
        s.state, s.held, s.record = State.SLEEPING if asleep else State.COLD, NOTHING, None
        if self.metrics is not None:
            self.metrics.evictions.labels(model, reason).inc()
            if asleep:
                self.metrics.sleeps.labels(model).inc()
        if asleep and r is not None:
            self._to_host(s, r, weights)
        self._gauges()

    def _to_host(self, s: Slot, r: Resident, weights: int) -> None:
        """``s`` sleeps: into the host tier, priced by its next full load; those that
        no longer fit there leave for good."""
        asleep = Resident(r.model, weights, s.load_s or r.reload_s, last_used=r.last_used)
        asleep.hits = max(0, r.hits - 1)
        self.policy.used(asleep, self.clock())  # scored as it stands, its uses kept
        for model in self.host.add(asleep):
            self._drop_sleeper(self._slots[model], "host tier")

    def _drop_sleeper(self, s: Slot, reason: str) -> None:
        """A sleeping model leaves for good (its weights already left memory)."""
        model = s.member.model_id
        log.info("evicting %s, asleep (%s)", model, reason)
        self.host.remove(model)
        s.member.unload()
        s.state = State.COLD
        if self.metrics is not None:
            self.metrics.evictions.labels(model, reason).inc()
        self._gauges()

    async def _evict_all(self, keep: str, reason: str) -> bool:
        """Out of memory: evict every model that may leave except ``keep``."""
        async with self._room:
            now = self.clock()
            out = [
                s
                for m, s in self._slots.items()
                if m != keep and s.record is not None and evictable(s.record, now)
            ]
            for s in out:
                self._evict(s, reason)
            if out:
                self._trim()
            return bool(out)

    async def relieve(self, model: str) -> bool:
        """An out-of-memory error in ``model``'s batch: make room by evicting others."""
        return await self._evict_all(model, "oom")

    async def _shed(self, keep: str) -> None:
        """Over budget after a load measured more than expected: evict what may leave."""
        async with self._room:
            others = [r for r in self._slots.records() if r.model != keep]
            chosen = victims_until(
                self.policy, others, lambda gone: self._free_without(gone) >= 0, self.clock()
            )
            for r in chosen or []:
                self._evict(self._slots[r.model], "pressure")
            if chosen:
                self._trim()

    def _failed(self, s: Slot, exc: BaseException) -> None:
        """Remember why ``s`` failed (``Slot.fail``); cancelled: cold again."""
        model = s.member.model_id
        if not isinstance(exc, Exception):  # cancelled: cold again, nothing to remember
            s.state, s.held = State.COLD, NOTHING
            self._gauges()
            return
        with_reason = s.fail(exc, self.clock(), self.cooldown)
        log.warning("%s failed to load: %s", model, with_reason.message)
        if self.metrics is not None:
            self.metrics.loads.labels(model, "failed").inc()
        self._gauges()

    def _check(self, event: str, model: str, moved: int) -> None:
        """The charge for weights (and the hot adapters) against what the process holds
        (``drift.py``), unless a load is under way (it holds part of its reservation
        only). The state models serve with (KV caches) is held only while they run:
        the slack either way."""
        if self.drift is not None and not self._slots.loading():
            moved, self._evicted = moved + self._evicted, 0
            charged = self._slots.weights() + self.adapters()
            self.drift.check(event, model, charged, moved, self._slots.states())

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.resident_models.set(self._slots.resident())
            self.metrics.resident_bytes.set(self.used())
            self.metrics.sleeping_bytes.set(self.host.used)


__all__ = ["Fleet", "Member", "State", "is_oom"]
