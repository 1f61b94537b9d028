"""Each runner's hosting of its base's adapters (the parts it is made of: ``lora_tier``).

Requests for different adapters of one base model share the base's runner and its
batches. Before a request's items join a batch, its adapter must be *hot*: read from
the warm tier (local disk, filled from the object store) on a thread of its own and
added to the model's :class:`~fleetserve.lora.mixed.LoraBank` on the compute thread
between batches, so loading one never holds up other traffic. The hot tier is shared
by the worker's models and bounded in bytes; the least recently used adapter that no
batch is about to run leaves first.

Adapters run on the torch runtime, or inside the graph of a runtime that has LoRA
slots (OpenVINO, ``--lora-in-graph``: a :class:`SlotHost`). A base served on another
runtime (the tuned ONNX profile) keeps it for batches of base rows only, and gets a
torch copy at the profile's precision (where torch has it) for batches with adapter
rows, base rows included. The copy, or the graph with slots, is made at start for a
model loaded at start (``--adapter-hosts eager``), else on its first adapter request,
off the hot path, and charged to the memory budget before it is made. A graph with
slots that cannot be made leaves adapters to a torch copy, saying so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..families import AnyFamily
from ..lora.bases import ADAPTER_FAMILIES, check_takes_adapters
from ..wire import AdapterNotFound, InvalidInput
from .lora_tier import (
    AdapterHost,
    AdapterSource,
    HotTier,
    SlotHost,
    SlotJudge,
    host_of,
    slot_host,
)

if TYPE_CHECKING:
    from ..catalog import ModelSpec

log = logging.getLogger("fleetserve.worker")


class AdapterHosting:
    """The adapter side of one runner, a part every runner holds (``runner.adapters``):
    where its model's adapters come from and which are hot, the torch copy of a base
    served elsewhere, and the bank's plan for a batch. It reads the family the runner
    serves through ``served`` (it changes with loads, evictions and profile swaps) and
    adds adapters on the runner's compute thread (``forward``), between batches."""

    def __init__(
        self,
        spec: ModelSpec,
        served: Callable[[], AnyFamily | None],
        forward: ThreadPoolExecutor,
    ) -> None:
        self.spec = spec
        self._served = served
        self._forward = forward
        self._hosting: tuple[AdapterSource, HotTier] | None = None
        self._loads: dict[str, asyncio.Future[None]] = {}  # adapters being made hot
        self._rehosting: asyncio.Lock | None = None
        self._fitting: asyncio.Future[None] | None = None  # slots fit to the hot adapters
        self._judged = False  # the served graph's slots passed (or had no) slot_gate
        # judges the served graph's slots before adapters run there (None: no gate)
        self.slot_gate: SlotJudge | None = None
        self._copy: AnyFamily | None = None  # the base on torch, beside a non-torch runtime
        self.torch_factory: Callable[[], AnyFamily] | None = None  # the model on torch
        # room in the fleet's budget for bytes more beside this model (its torch copy or
        # graph with slots), made as for a load (``Fleet.room_beside``); None: no budget
        self.room: Callable[[str, int], Awaitable[None]] | None = None

    def host(self, source: AdapterSource, tier: HotTier) -> None:
        """Serve adapters of this model: found in ``source``, counted in ``tier``."""
        self._hosting = (source, tier)
        self._loads = {}

    def takes(self, key: str) -> None:
        """Raise a 400 if this model cannot serve adapter ``key``."""
        check_takes_adapters(self.spec.id, self.spec.family)
        if self._hosting is None:
            raise InvalidInput(
                f"this worker serves no adapters of {self.spec.id!r}", field="adapter"
            )

    def alive(self, key: str) -> bool:
        return self._hosting is not None and self._hosting[0].alive(key)

    def heating(self, key: str) -> bool:
        """Whether ``key`` is being made hot now (its requests wait for it)."""
        return key in self._loads

    def hot(self, key: str) -> bool:
        host = host_of(self.host_family)
        return host is not None and key in host.lora_bank()

    @property
    def host_family(self) -> AnyFamily | None:
        """The family that runs batches with adapter rows: the served one where
        its runtime takes adapters, else its torch copy (None until there is one)."""
        served = self._served()
        if host_of(served) is not None:
            return served
        return self._copy

    def info(self) -> dict[str, object]:
        """For ``/v1/models``: where adapter batches run and how many adapters are hot."""
        host = self.host_family
        if self._hosting is None or host is None:
            return {}
        rt = host.runtime
        bank = host_of(host)
        hot = len(bank.lora_bank()) if bank is not None else 0
        return {"runtime": rt.name, "precision": rt.precision, "hot": hot}

    async def prepare(self) -> None:
        """Make the adapter host now (a model loaded at start, before any adapter): the
        graph with slots on the layers fine-tuning targets, or the torch copy."""
        if self._hosting is not None and self.spec.family in ADAPTER_FAMILIES:
            served = self._served()
            slots = served is not None and slot_host(served) is not None
            if slots or self.torch_factory is not None:
                await self._ready()

    def mark(self, key: str, delta: int) -> None:
        if self._hosting is not None:
            self._hosting[1].mark(self.spec.id, key, delta)

    async def heat(self, key: str) -> None:
        """Make ``key`` hot (concurrent callers share one load); raises its failure."""
        assert self._hosting is not None
        try:
            await self._hosting[0].check(key)  # deleted since the gateway resolved it: 404
        except AdapterNotFound:
            await self._drop(key)
            raise
        if self.hot(key):
            self._hosting[1].touch(self.spec.id, key)
            return
        fut = self._loads.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._heat(key))
            self._loads[key] = fut
            fut.add_done_callback(lambda f: self._heated(key, f))
        await asyncio.shield(fut)

    async def ensure_hot(self, key: str) -> None:
        """For the batch loop: no I/O when ``key`` is hot (its request's ``heat`` checked
        it in the store); else heat it again (it left the hot tier meanwhile)."""
        if self.hot(key):
            assert self._hosting is not None
            self._hosting[1].touch(self.spec.id, key)
            return
        await self.heat(key)

    def _heated(self, key: str, fut: asyncio.Future[None]) -> None:
        self._loads.pop(key, None)
        if not fut.cancelled():
            fut.exception()  # retrieved: its awaiters (if any are left) raise it

    async def _heat(self, key: str) -> None:
        assert self._hosting is not None
        source, tier = self._hosting
        from ..lora.load import read_adapter

        loop = asyncio.get_running_loop()
        reader = ThreadPoolExecutor(1, thread_name_prefix="adapter")
        try:
            async with source.hold(key) as path:  # not evicted from disk while read
                tensors, scaling = await loop.run_in_executor(reader, read_adapter, path)
        finally:
            reader.shutdown(wait=False)
        await self._ready(list(tensors))  # a torch copy, or slots on the adapter's layers
        model = self.spec.id

        def add() -> list[str]:  # on the compute thread, between batches
            runtime = self.runtime()
            hot = runtime.lora_bank().add(key, tensors, scaling)
            pinned = source.pinned(key)
            return tier.admit(model, key, hot.nbytes, runtime.lora_bank(), pinned=pinned)

        evicted = await loop.run_in_executor(self._forward, add)
        if evicted:
            log.info("adapters left the hot tier: %s", ", ".join(evicted))
        served = self._served()
        slots = slot_host(served) if served is not None else None
        if slots is not None:  # its stacks grow with the ranks: charged as they may
            tier.copies[model] = slots.adapter_bytes()
        if served is not None and slots is not None and self._fitting is None:
            self._fitting = asyncio.ensure_future(self._fit(served))
            self._fitting.add_done_callback(self._fitted)

    async def _fit(self, served: AnyFamily) -> None:
        """Slots on just the layers the hot adapters use, made in the background (the
        adapters serve meanwhile on the graph they are in), one fit at a time."""
        rt = slot_host(served)
        assert rt is not None and self._hosting is not None and self._rehosting is not None
        async with self._rehosting:  # (not while slots are widened for an adapter)
            loop = asyncio.get_running_loop()
            loader = ThreadPoolExecutor(1, thread_name_prefix="loader")
            try:
                fit = await loop.run_in_executor(loader, rt.fit_adapters)
                if fit and self._served() is served:  # (still loaded: still charged)
                    self._hosting[1].copies[self.spec.id] = rt.adapter_bytes()
                    log.info("%s: LoRA slots now on the layers its hot adapters use", self.spec.id)
            finally:
                loader.shutdown(wait=False)

    async def settle(self) -> None:
        """Wait for a fit in flight (its conversion runs on a thread that cannot be
        cancelled): a stopped server leaves no conversion running behind it."""
        if self._fitting is not None:
            await asyncio.wait([self._fitting])

    def _fitted(self, fut: asyncio.Future[None]) -> None:
        self._fitting = None
        if not fut.cancelled() and (exc := fut.exception()) is not None:
            log.warning("%s: LoRA slots not fit to its adapters: %s", self.spec.id, exc)

    async def _drop(self, key: str) -> None:
        """A deleted adapter leaves memory and disk (pinned or not)."""
        assert self._hosting is not None
        source, tier = self._hosting
        source.forget(key)
        host = host_of(self.host_family)
        if host is not None and key in host.lora_bank():
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._forward, host.lora_bank().remove, key)
        tier.forget(self.spec.id, [key])

    def runtime(self) -> AdapterHost:
        host = host_of(self.host_family)
        if host is None:
            raise RuntimeError(f"model {self.spec.id} is not on an adapter runtime")
        return host

    async def _ready(self, modules: Sequence[str] = ()) -> None:
        """An adapter host for adapters on ``modules``: the served graph with slots on
        them where its runtime may have slots, else a torch copy of the base if it runs
        elsewhere (once, on a loader thread)."""
        current = self._served()
        slots = slot_host(current) if current is not None else None
        if self._judged and slots is not None and slots.takes_adapters and slots.covers(modules):
            return  # (not behind a fit to the hot adapters' layers: it took 4 s)
        if self._rehosting is None:
            self._rehosting = asyncio.Lock()
        async with self._rehosting:
            current = self._served()
            if current is None:
                raise RuntimeError(f"model {self.spec.id} is not loaded")
            slots = slot_host(current)
            if slots is not None and await self._slots(current, slots, modules):
                return
            if host_of(current) is not None or self._copy is not None:
                return
            factory = self.torch_factory
            if factory is None:
                raise InvalidInput(
                    f"model {self.spec.id!r} runs on {current.runtime.name}, which cannot "
                    "take adapters",
                    field="adapter",
                )
            assert self._hosting is not None
            copies = self._hosting[1].copies
            # charged before it loads, as a load is: the served model's count (its
            # weights on another runtime), until the copy's own count replaces it
            estimate = current.memory_bytes()
            if self.room is not None:
                await self.room(self.spec.id, estimate)
            copies[self.spec.id] = estimate  # (nothing awaited since the room was made)
            loop = asyncio.get_running_loop()
            loader = ThreadPoolExecutor(1, thread_name_prefix="loader")
            try:
                fresh = await loop.run_in_executor(loader, factory)
                await loop.run_in_executor(loader, fresh.load)
                await loop.run_in_executor(self._forward, fresh.warmup)
            except BaseException:
                copies.pop(self.spec.id, None)
                raise
            finally:
                loader.shutdown(wait=False)
            rt = fresh.runtime
            log.info(
                "%s: batches with adapters run on %s %s (base-only batches stay on %s %s)",
                self.spec.id,
                rt.name,
                rt.precision,
                current.runtime.name,
                current.runtime.precision,
            )
            self._copy = fresh
            copies[self.spec.id] = fresh.memory_bytes() or estimate

    async def _slots(self, current: AnyFamily, rt: SlotHost, modules: Sequence[str]) -> bool:
        """Slots on ``modules`` in ``current``'s graph, charged as a load is before the
        first are made; False where they cannot be made (then adapters go to a torch
        copy). An adapter's module that is not a Linear layer raises its 400."""
        if rt.takes_adapters and rt.covers(modules):
            return True
        assert self._hosting is not None
        copies = self._hosting[1].copies
        first = not rt.takes_adapters
        if first:
            estimate = current.memory_bytes()  # as the served graph's, until it is made
            if self.room is not None:
                await self.room(self.spec.id, estimate)
            copies[self.spec.id] = estimate
        loop = asyncio.get_running_loop()
        loader = ThreadPoolExecutor(1, thread_name_prefix="loader")
        try:
            await loop.run_in_executor(loader, _prepare, rt, list(modules))
            if first and not await self._judge(current, loader):
                rt.give_up_slots()
                copies.pop(self.spec.id, None)
                return False
        except InvalidInput:
            if first:
                copies.pop(self.spec.id, None)
            if not modules:  # (no layer fine-tuning targets: an adapter brings its own)
                return True
            raise
        except Exception as exc:
            if first:
                rt.give_up_slots()
                copies.pop(self.spec.id, None)
            log.warning("%s: no LoRA slots in its %s graph (%s): adapters run on a torch "
                        "copy", self.spec.id, current.runtime.name, exc)  # fmt: skip
            return False
        finally:
            loader.shutdown(wait=False)
        copies[self.spec.id] = rt.adapter_bytes()
        if first:
            self._judged = True
            log.info("%s: batches with adapters run in its %s %s graph, with LoRA slots",
                     self.spec.id, current.runtime.name, current.runtime.precision)  # fmt: skip
        return True

    async def _judge(self, current: AnyFamily, loader: ThreadPoolExecutor) -> bool:
        """Whether the served graph's new slots pass the quality gate (``slot_gate``):
        the fp32 reference loads on ``loader``, the comparison runs on the compute
        thread between batches. True without a gate, or where these weights passed."""
        gate = self.slot_gate
        if gate is None:
            return True
        loop = asyncio.get_running_loop()
        ref = await loop.run_in_executor(loader, gate.prepare)
        return ref is None or await loop.run_in_executor(self._forward, gate.passes, current, ref)

    def plan(
        self, keys: list[str | None], host: AnyFamily | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """The bank's plan for a batch whose row ``i`` runs ``keys[i]`` (a context
        manager; a no-op when no row has an adapter), on ``host`` (the adapter host the
        batch was given when it started; default: the current one)."""
        if not any(keys):
            return contextlib.nullcontext()
        from ..lora.mixed import segments_of

        bank = self.runtime() if host is None else host_of(host)
        if bank is None:
            raise RuntimeError(f"model {self.spec.id} is not on an adapter runtime")
        return bank.lora_bank().plan(segments_of(keys), len(keys))

    def rehost(self, old: AnyFamily | None) -> None:
        """The served family replaced ``old`` (a profile swap). Where the LoRA bank was
        ``old``'s own (torch), or the new one takes adapters itself and a torch copy is
        no longer needed, the hot adapters are forgotten: they heat again on next use.
        A torch copy beside runtimes that take none stays, with its hot adapters."""
        if host_of(old) is not None or host_of(self._served()) is not None:
            self.unhost()

    def unhost(self) -> None:
        """The model left memory: its torch copy and hot adapters went with it."""
        self._copy, self._judged = None, False
        if self._hosting is not None:
            self._hosting[1].forget(self.spec.id)


def _prepare(rt: SlotHost, modules: list[str]) -> None:
    """Slots on ``modules``, and what reading an adapter imports (torch, which a graph
    with slots kept from an earlier conversion does not need: imported on the first
    adapter's request, it took 0.9 to 1.3 s of its first call)."""
    rt.prepare_adapters(modules)
    importlib.import_module("fleetserve.lora.load")
    importlib.import_module("fleetserve.lora.mixed")
