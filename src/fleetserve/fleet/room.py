"""Room in one device's memory budget: what is held against it, who leaves to make
room for a load and how (asleep in the host tier where a model can sleep, else
unloaded), room held beside the models, and the answer when no model can leave: a
503 naming who holds the budget and why they stay, with a Retry-After for when room
frees (``no_room``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence

from ..metrics import Metrics
from ..wire import Unavailable
from .host_tier import HostTier
from .member import Footprint, State, held_together
from .policy import Policy, Resident, evictable, victims_until, worth_waiting
from .slot import NOTHING, Slot
from .slots import Slots

log = logging.getLogger("fleetserve.fleet")
MIB = 1 << 20


class Room:
    """The memory budget of one device's fleet and the evictions that keep it.

    ``Fleet`` owns the slots and changes a slot's state for a load; this changes it
    for an eviction. One making room at a time (``lock``); ``changed`` is set when
    work finishes, a model leaves or loads, or a hold beside them ends."""

    def __init__(
        self,
        slots: Slots,
        budget: int,
        policy: Policy,
        *,
        metrics: Metrics | None,
        cooldown: float,
        room_wait: float,
        clock: Callable[[], float],
        trim: Callable[[], None],
        budget_now: Callable[[], int] | None,
        host_budget: int,
    ) -> None:
        self.budget = self._shared = budget
        self._budget_now = budget_now
        self._slots = slots
        self.policy = policy
        self.metrics = metrics
        self.cooldown = cooldown
        self.room_wait = room_wait
        self.clock = clock
        self.trim = trim
        self.adapters: Callable[[], int] = lambda: 0  # bytes of the hot LoRA adapters
        self.host = HostTier(host_budget, policy)
        self.lock = asyncio.Lock()  # one making room at a time
        self.changed = asyncio.Event()  # work finished, a model left or loaded
        self.evicted = 0  # weights evicted since the drift check last looked
        self.wake_per_byte = 0.0  # the last wake's seconds per byte it brought back
        self.retained = 0  # held by the process beyond every charge (``retain``)

    # -- what is held -------------------------------------------------------------
    def rebudget(self) -> None:
        """The budget as ``budget_now`` says (the host's share), looked at before a load."""
        if self._budget_now is not None and (now := self._budget_now()) != self._shared:
            self._shared = self.budget = now
            if self.metrics is not None:
                self.metrics.memory_budget.set(now)

    def used(self, extra: Footprint = NOTHING) -> int:
        """Bytes held (``Slots.held``: ``beside`` too), with ``extra`` added, the hot
        adapters and what the process ``retained``."""
        return self._slots.held(extra) + self.adapters() + self.retained

    def free_without(self, gone: Sequence[Resident], peak: int = 0, retained: bool = True) -> int:
        """The budget left were ``gone`` evicted, beside an activation ``peak``: their
        weights free, and their peaks where they were the largest (``retained``: less
        what the process holds beyond every charge)."""
        leaving = {r.model for r in gone}
        held = self._slots.held(Footprint(0, peak), leaving) + self.adapters()
        return self.budget - held - (self.retained if retained else 0)

    def retain(self, unaccounted: int) -> None:
        """What the process holds beyond every charge, as the drift checks add it up
        (``Drift.unaccounted``), less the activation peak the budget keeps for one
        batch (an allocator keeps a batch's memory for the next), is charged like a
        model's weights: loads evict for it. A runtime may keep part of what an
        unloaded model held: on a 16-model trace (2-core cpu-avx512bf16) each
        OpenVINO unload gave back 30 to 40 MiB less than its charge, which the next
        load took up again, and the resident set grew 1.12 to 1.14x the budget under
        LRU. The sum falls again as such memory is let go (a check whose process grew
        less than its charge)."""
        self.retained = max(0, unaccounted - self._slots.peak())
        self.gauges()

    def pinned_need(self) -> int:
        """What the pinned models hold together, or will."""
        return held_together(self._slots.pinned())

    def price(self, s: Slot, kept: int, dt: float) -> float:
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
            if self.wake_per_byte:
                return self.wake_per_byte * kept
        return s.load_s or dt

    # -- making room ----------------------------------------------------------------
    async def make(self, model: str, need: Footprint, deadline: float, wait: bool) -> None:
        """Room for ``model`` to load with ``need``: the policy's victims evicted, busy
        ones waited for until ``deadline`` or ``room_wait`` (not at all without
        ``wait``); ``Unavailable`` (``no_room``) when none frees in time, at once when
        the pinned models leave too little. Where the policy would rather evict models
        that are busy now than the idle ones it can, it waits for them too, at most the
        reload seconds that saves (``worth_waiting``): on a 16-model trace with 4 clients
        (2-core cpu-avx512bf16) GDSF made 34 to 40 loads a run against 39 to 42."""
        if held_together([*self._slots.pinned(but=model), need]) > self.budget:
            raise Unavailable(
                f"model {model!r} needs {need.total / MIB:.1f} MiB to load (its weights, "
                "what its load holds beside them and a batch's activations) but the memory budget "
                f"({self.budget / MIB:.1f} MiB) leaves "
                f"{(self.budget - self.pinned_need()) / MIB:.1f} MiB beside the pinned models",
                retry_after=self.cooldown,
            )
        give_up = min(deadline, self.clock() + (self.room_wait if wait else 0.0))

        def victims(retained: bool, busy_too: bool = False) -> list[Resident] | None:
            return victims_until(
                self.policy,
                [r for r in self._slots.records() if r.model != model],  # (room_beside's)
                lambda gone: need.kept <= self.free_without(gone, need.peak, retained),
                self.clock(),
                busy_too,
            )

        patience: float | None = None  # how long the policy's busy first choices are waited for
        while True:
            until = give_up
            async with self.lock:
                retained = True
                chosen = victims(True)
                if chosen is None and self.retained:  # an estimate: it never stops a load
                    retained, chosen = False, victims(False)
                saved = worth_waiting(chosen, victims(retained, True)) if chosen and wait else 0.0
                if saved > 0:
                    patience = self.clock() + saved if patience is None else patience
                    if self.clock() < min(patience, give_up):
                        chosen, until = None, min(patience, give_up)  # for them to finish
                if chosen is not None:
                    for r in chosen:
                        self.evict(self._slots[r.model], "pressure")
                    if chosen:
                        self.trim()
                    return
                self.changed.clear()
            left = until - self.clock()
            if left <= 0 and until == give_up:
                free = self.free_without((), need.peak, retained=False)
                raise no_room(
                    model, (need.total, need.kept), self.budget, free, self._slots.records(),
                    lambda m: self._slots[m].held.total, self.clock(), self.cooldown,
                )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), max(0.0, left))

    @contextlib.asynccontextmanager
    async def beside(
        self, holder: str, nbytes: int, waiting: Callable[[], None] = lambda: None
    ) -> AsyncIterator[None]:
        """``nbytes`` of the budget held for ``holder`` (a training job's process) for
        the block. Room is made as for a load (the policy evicts idle models, never a
        pinned one) and waited for as long as it takes while busy or kept-alive models
        hold it (``waiting`` is called once, then). ``Unavailable`` at once where the
        pinned models leave too little."""
        left = self.budget - self.pinned_need()
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
                await self.make("", Footprint(nbytes), self.clock() + self.room_wait, True)
                break
            except Unavailable:
                if not told:
                    waiting()
                    told = True
                await self.changed.wait()  # work finished, a model left, a keep-alive ran out
        key, beside = holder, self._slots.beside
        while key in beside:  # two holds of one name stay two
            key += "'"
        beside[key] = nbytes  # nothing awaited since the room was found
        self.gauges()
        try:
            yield
        finally:
            del beside[key]
            self.changed.set()
            self.gauges()

    # -- who leaves -------------------------------------------------------------------
    def evict(self, s: Slot, reason: str) -> None:
        """``s`` leaves the memory budget: asleep in the host tier where it can sleep
        (not when removed), else unloaded."""
        r = s.record
        model = s.member.model_id
        asleep = self.host.budget > 0 and reason != "removed" and s.member.sleep() > 0
        log.info(
            "%s %s (%.1f MiB, %s)", "sleeping" if asleep else "evicting", model,
            s.held.total / MIB, reason,
        )  # fmt: skip
        self.evicted += s.held.weights
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
        self.gauges()

    def _to_host(self, s: Slot, r: Resident, weights: int) -> None:
        """``s`` sleeps: into the host tier, priced by its next full load; those that
        no longer fit there leave for good."""
        asleep = Resident(r.model, weights, s.load_s or r.reload_s, last_used=r.last_used)
        asleep.hits = max(0, r.hits - 1)
        self.policy.used(asleep, self.clock())  # scored as it stands, its uses kept
        for model in self.host.add(asleep):
            self.drop_sleeper(self._slots[model], "host tier")

    def drop_sleeper(self, s: Slot, reason: str) -> None:
        """A sleeping model leaves for good (its weights already left memory)."""
        model = s.member.model_id
        log.info("evicting %s, asleep (%s)", model, reason)
        self.host.remove(model)
        s.member.unload()
        s.state = State.COLD
        if self.metrics is not None:
            self.metrics.evictions.labels(model, reason).inc()
        self.gauges()

    async def evict_all(self, keep: str, reason: str) -> bool:
        """Out of memory: evict every model that may leave except ``keep``."""
        async with self.lock:
            now = self.clock()
            out = [
                s
                for m, s in self._slots.items()
                if m != keep and s.record is not None and evictable(s.record, now)
            ]
            for s in out:
                self.evict(s, reason)
            if out:
                self.trim()
            return bool(out)

    async def shed(self, keep: str) -> None:
        """Over budget after a load measured more than expected: evict what may leave."""
        async with self.lock:
            others = [r for r in self._slots.records() if r.model != keep]
            chosen = victims_until(
                self.policy, others, lambda gone: self.free_without(gone) >= 0, self.clock()
            )
            for r in chosen or []:
                self.evict(self._slots[r.model], "pressure")
            if chosen:
                self.trim()

    def gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.resident_models.set(self._slots.resident())
            self.metrics.resident_bytes.set(self.used())
            self.metrics.sleeping_bytes.set(self.host.used)


# -- the answer when nothing can leave ----------------------------------------------
def no_room(
    model: str,
    need: tuple[int, int],
    budget: int,
    free: int,
    records: Sequence[Resident],
    held: Callable[[str], int],
    now: float,
    cap: float,
) -> Unavailable:
    """``model`` needs ``need`` (its total bytes, its weights) and ``free`` bytes are
    free beside it; ``held`` says what a resident model holds; ``cap`` bounds the
    Retry-After (:func:`frees_in`)."""
    total, weights = need
    return Unavailable(
        f"no room for model {model!r} ({total / MIB:.1f} MiB): the budget of "
        f"{budget / MIB:.1f} MiB is held by models that may not leave now "
        f"({holders(records, held, now)})",
        retry_after=frees_in(records, weights, free, now, cap),
    )


def holders(records: Sequence[Resident], held: Callable[[str], int], now: float) -> str:
    """Who holds the budget and why they stay: pinned, busy, kept alive."""
    out = []
    for r in records:
        why = (
            "pinned"
            if r.pinned
            else "busy"
            if r.busy
            else f"kept alive {r.keep_until - now:.0f}s more"
            if now < r.keep_until
            else ""
        )
        if why:
            out.append(f"{r.model} {held(r.model) / MIB:.1f} MiB {why}")
    return "; ".join(out) or "loads under way"


def frees_in(records: Sequence[Resident], weights: int, free: int, now: float, cap: float) -> float:
    """Seconds until ``weights`` fit beside ``free``, were nothing used meanwhile: the
    keep-alives that must run out first (a busy model is taken to free within a second),
    at most ``cap`` (the cool-down, ``load_retry_after``), which it is too where only
    pinned models stand in the way (nothing will free). The cap: an hour's keep-alive
    is not an hour's Retry-After (an admin release or a model that leaves sooner lets
    it in)."""
    frees = sorted(
        (max(r.keep_until, now + 1.0) if r.busy else max(r.keep_until, now), r.bytes)
        for r in records
        if not r.pinned
    )
    for at, size in frees:
        free += size
        if weights <= free:
            return max(1.0, min(at - now, cap))
    return cap


__all__ = ["Room", "frees_in", "holders", "no_room"]
