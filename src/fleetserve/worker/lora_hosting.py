"""Adapters in a worker: the hot tier, and each runner's hosting of its base's adapters.

Requests for different adapters of one base model share the base's runner and its
batches. Before a request's items join a batch, its adapter must be *hot*: read from
the warm tier (local disk, filled from the object store) on a thread of its own and
added to the model's :class:`~fleetserve.lora.mixed.LoraBank` on the compute thread
between batches, so loading one never holds up other traffic. The hot tier is shared
by the worker's models and bounded in bytes; the least recently used adapter that no
batch is about to run leaves first.

Adapters run on the torch runtime. A base served on another runtime (the tuned
ONNX or OpenVINO profile) keeps it for batches of base rows only, and gets a torch
copy at the profile's precision (where torch has it) for batches with adapter rows,
base rows included: loaded at start for a model loaded at start
(``--adapter-hosts eager``), else on its first adapter request, off the hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..families import AnyFamily
from ..lora.bases import ADAPTER_FAMILIES, check_takes_adapters
from ..wire import AdapterNotFound, InvalidInput

if TYPE_CHECKING:
    from ..catalog import ModelSpec
    from ..lora.mixed import LoraBank

log = logging.getLogger("fleetserve.worker")


class AdapterSource(Protocol):
    """Where a worker finds adapters by their resolved id (``tenant/name@version``)."""

    def hold(self, key: str) -> contextlib.AbstractAsyncContextManager[Path]:
        """A local directory with the adapter's two files (the warm tier), kept while
        the block reads it; raises ``AdapterNotFound`` if it was deleted."""
        ...

    def forget(self, key: str) -> int:
        """Drop the adapter's local copies (it was deleted)."""
        ...

    def alive(self, key: str) -> bool:
        """False once the adapter is known to be deleted (cheap: no I/O)."""
        ...

    async def check(self, key: str) -> None:
        """Raise ``AdapterNotFound`` if the adapter was deleted (through any gateway)."""
        ...

    def pinned(self, key: str) -> bool:
        """Whether the adapter was uploaded pinned: it never leaves the hot tier."""
        ...


@runtime_checkable
class AdapterHost(Protocol):
    """A runtime (torch), or a family running its own model (generation), that runs
    mixed-adapter batches."""

    @property
    def takes_adapters(self) -> bool: ...

    def lora_bank(self) -> LoraBank: ...


def host_of(adapter: AnyFamily | None) -> AdapterHost | None:
    """What holds ``adapter``'s LoRA bank: the family (generation runs its own model)
    or its runtime (torch); None on a runtime that cannot take adapters."""
    if isinstance(adapter, AdapterHost):
        return adapter if adapter.takes_adapters else None
    if adapter is not None and isinstance(adapter.runtime, AdapterHost):
        return adapter.runtime if adapter.runtime.takes_adapters else None
    return None


class HotTier:
    """Every hot adapter of a worker, least recently used first, within ``cap`` bytes."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lru: OrderedDict[tuple[str, str], tuple[int, LoraBank]] = OrderedDict()
        self.busy: Counter[tuple[str, str]] = Counter()  # batches about to run them
        self.pinned: set[tuple[str, str]] = set()  # never evicted
        self.copies: dict[str, int] = {}  # model -> bytes of its torch copy for adapters
        self._lock = threading.Lock()  # busy: batches, generation threads, the compute thread

    def mark(self, model: str, key: str, delta: int) -> None:
        """A batch (or a running sequence) is about to use ``key`` (+1), or is done (-1):
        an adapter in use never leaves."""
        with self._lock:
            self.busy[(model, key)] += delta
            if self.busy[(model, key)] <= 0:
                del self.busy[(model, key)]

    @property
    def nbytes(self) -> int:
        """Bytes of the hot adapters (what ``cap`` bounds)."""
        return sum(n for n, _ in self._lru.values())

    @property
    def held(self) -> int:
        """Everything adapters hold here: the hot ones and the torch copies of bases."""
        return self.nbytes + sum(self.copies.values())

    def touch(self, model: str, key: str) -> None:
        if (model, key) in self._lru:
            self._lru.move_to_end((model, key))

    def admit(
        self, model: str, key: str, nbytes: int, bank: LoraBank, *, pinned: bool = False
    ) -> list[str]:
        """Count a new hot adapter; evict the least recently used idle, unpinned ones
        until all fit (call on the compute thread). Returns the evicted ``model:key``s."""
        self._lru[(model, key)] = (nbytes, bank)
        if pinned:
            self.pinned.add((model, key))
        evicted = []
        with self._lock:
            for other in list(self._lru):
                if self.nbytes <= self.cap:
                    break
                if other == (model, key) or self.busy.get(other) or other in self.pinned:
                    continue
                _, other_bank = self._lru.pop(other)
                other_bank.remove(other[1])
                evicted.append(f"{other[0]}:{other[1]}")
        return evicted

    def forget(self, model: str, keys: Iterable[str] | None = None) -> None:
        """A model unloaded (its bank is gone) or adapters deleted."""
        if keys is None:
            self.copies.pop(model, None)
        for m, k in list(self._lru):
            if m == model and (keys is None or k in keys):
                del self._lru[(m, k)]
                self.pinned.discard((m, k))


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
        self._copy: AnyFamily | None = None  # the base on torch, beside a non-torch runtime
        self.torch_factory: Callable[[], AnyFamily] | None = None  # the model on torch
        # room in the fleet's budget for bytes more beside this model (its torch copy),
        # made as for a load (``Fleet.room_beside``); None: no budget to make room in
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
        """Load the torch copy now (a model loaded at start, before any adapter)."""
        if (
            self._hosting is not None
            and self.torch_factory is not None
            and self.spec.family in ADAPTER_FAMILIES
        ):
            await self._to_torch()

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

        await self._to_torch()
        loop = asyncio.get_running_loop()
        reader = ThreadPoolExecutor(1, thread_name_prefix="adapter")
        try:
            async with source.hold(key) as path:  # not evicted from disk while read
                tensors, scaling = await loop.run_in_executor(reader, read_adapter, path)
        finally:
            reader.shutdown(wait=False)
        model = self.spec.id

        def add() -> list[str]:  # on the compute thread, between batches
            runtime = self.runtime()
            hot = runtime.lora_bank().add(key, tensors, scaling)
            pinned = source.pinned(key)
            return tier.admit(model, key, hot.nbytes, runtime.lora_bank(), pinned=pinned)

        evicted = await loop.run_in_executor(self._forward, add)
        if evicted:
            log.info("adapters left the hot tier: %s", ", ".join(evicted))

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

    async def _to_torch(self) -> None:
        """A torch copy of the base if it runs elsewhere (once, on a loader thread)."""
        if self._rehosting is None:
            self._rehosting = asyncio.Lock()
        async with self._rehosting:
            current = self._served()
            if current is None:
                raise RuntimeError(f"model {self.spec.id} is not loaded")
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
        self._copy = None
        if self._hosting is not None:
            self._hosting[1].forget(self.spec.id)
