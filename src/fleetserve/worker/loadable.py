"""Loading and unloading a served model, shared by both kinds of runner."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Protocol, Self

from ..catalog import ModelSpec, Profile
from ..families import AnyFamily, family_tasks
from ..fleet.member import Footprint
from ..fleet.memory import PRECISION_SHARE
from ..runtimes import Sleeps
from ..wire import Task
from .compute import compute_executor
from .load_watch import LoadWatch, moved
from .lora_hosting import AdapterHosting

log = logging.getLogger("fleetserve.fleet")
FamilyFactory = Callable[[], AnyFamily]


class Verify(Protocol):
    """A check of a loaded adapter that returns the one to serve (the quality gate):
    ``prepare`` runs on the loader thread (``None``: nothing to check, the adapter
    passed before), ``judge`` on the compute thread."""

    def prepare(self) -> AnyFamily | None: ...

    def judge(self, adapter: AnyFamily, reference: AnyFamily) -> AnyFamily: ...


Measure = Callable[[AnyFamily], int]  # a loaded adapter -> its activation peak (bytes)


class Estimate(Protocol):
    """What a model's weights will hold before it loads, and what a load found: the
    weights a load measured, kept for the next process (an ONNX Runtime or OpenVINO
    model holds 1.5 to 2.5 times its files: the engine's own copies)."""

    def __call__(self) -> int: ...

    def remember(self, weights: int) -> None: ...


class Loadable:
    """Loading and unloading shared by runners; the fleet manager decides when.

    ``eager`` runners (pinned, or named in ``--models``) load at start and gate
    readiness; the others load on first use. Pinned ones never leave; the others may
    be evicted and load again on their next use. A load resolves,
    fetches, converts and loads the weights on a loader thread of its own, so the
    compute thread keeps running other models' batches; only the warm-up, the quality
    gate and the activation-peak batch run on the compute thread. It measures what the
    model holds: its weights (the resident growth where it is the model's own, else the
    runtime's count: ``load_watch.py``), the activation peak of a full batch (the
    profile's own figure where the tuner measured one) and what the load held for a
    moment beyond what stayed. Its LoRA adapters are a part it holds: ``adapters``.

    With ``may_sleep`` (the fleet has a host tier and the model is not pinned), a load
    puts the weights on a mapped copy where its runtime can (``Sleeps``); under
    pressure the fleet then asks it to ``sleep`` before it evicts, and the next
    ``load`` wakes it: no read, conversion, warm-up or gate, the footprint its load
    measured. A wake that fails falls back to a load.
    """

    spec: ModelSpec
    profile: Profile
    eager: bool
    loaded: bool
    _family: AnyFamily | None
    _factory: FamilyFactory
    _load_lock: asyncio.Lock | None
    _forward: ThreadPoolExecutor
    _verify: Verify | None
    _measure: Measure | None
    _estimate: Estimate | None
    _measured: Footprint | None

    def __init__(
        self,
        spec: ModelSpec,
        profile: Profile,
        adapter: AnyFamily | FamilyFactory,
        eager: bool,
        verify: Verify | None = None,
        measure: Measure | None = None,
        estimate: Estimate | None = None,
        may_sleep: bool = False,
    ) -> None:
        """``adapter`` is a loaded-on-demand adapter, or a factory that builds one.
        ``verify`` runs on the loaded adapter (on the compute thread) and returns the
        adapter to serve: a quality gate may swap in another. ``measure`` gives the
        activation peak of a full batch when the profile has no figure; ``estimate``
        the weights before the first load (what an earlier process's load measured, else
        the weights on disk), and it keeps what each full load measures."""
        self.spec = spec
        self.profile = profile
        self._profile0 = profile
        self._measure = measure
        self._estimate = estimate
        self._measured: Footprint | None = None
        self._estimated: int | None = None
        self.ever_loaded = False
        self.memory: dict[str, int] = {}  # what the last load measured
        if isinstance(adapter, AnyFamily):
            self._family, self._factory = adapter, lambda: adapter
        else:
            self._family, self._factory = None, adapter
        self.eager = eager
        self.may_sleep = may_sleep and not spec.pinned
        self.sleeping = False  # loaded, with its weights let go (``sleep``)
        self._mapped = 0  # the bytes its last load put on a mapped copy (``_map``)
        self._load_lock = None
        self._verify = verify
        self._forward = compute_executor()  # shared: one OpenMP pool per process
        self.adapters = AdapterHosting(spec, lambda: self._family, self._forward)

    @property
    def family(self) -> AnyFamily:
        if self._family is None:
            raise RuntimeError(f"model {self.spec.id} is not loaded")
        return self._family

    @property
    def family_or_none(self) -> AnyFamily | None:
        return self._family

    @property
    def tasks(self) -> frozenset[Task]:
        """What this model serves, known before it is loaded."""
        if self._family is not None:
            return self._family.tasks
        return family_tasks(self.spec.family)

    @property
    def model_id(self) -> str:
        return self.spec.id

    @property
    def pinned(self) -> bool:
        return self.spec.pinned

    @property
    def keep_alive(self) -> float:
        return self.spec.keep_alive

    def expected(self) -> Footprint:
        """Measured at its last load; else the weights on disk and the profile's figure
        (weights plus peak, as the tuner measured them), and, where a quality gate
        runs, its fp32 reference beside them while it loads."""
        if self._measured is not None:
            return self._measured
        if self._estimated is None:
            self._estimated = self._estimate() if self._estimate is not None else 0
        weights = self._estimated or self.profile.memory_bytes
        reference = 0
        if self._verify is not None:  # the estimate is at the served precision
            reference = int(weights / PRECISION_SHARE.get(self.profile.precision, 1.0))
        return Footprint(weights, max(0, self.profile.memory_bytes - weights), reference)

    async def load(self) -> Footprint:
        """Load the model (once; concurrent callers share it); what it holds."""
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        async with self._load_lock:
            if self.loaded and self._measured is not None:
                return self._measured
            if self.sleeping and (woken := await self._woken()) is not None:
                return woken
            watch = LoadWatch(self.profile.runtime or self.spec.runtime)
            try:
                return await self._load(watch)
            finally:
                watch.abandon()  # (a no-op once done)

    async def _load(self, watch: LoadWatch) -> Footprint:
        loop = asyncio.get_running_loop()
        # a thread per load: it ends with the load, and its OpenMP pool with it
        loader = ThreadPoolExecutor(1, thread_name_prefix="loader")
        try:
            adapter = self._family
            if adapter is None:
                adapter = await loop.run_in_executor(loader, self._factory)
            await loop.run_in_executor(loader, adapter.load)
            mapped = 0
            if self.may_sleep:
                mapped = await loop.run_in_executor(loader, self._map, adapter)
            ref = None
            if self._verify is not None:  # the gate's fp32 reference loads here too
                ref = await loop.run_in_executor(loader, self._verify.prepare)
            grown = watch.loaded()  # a first load's has lazy imports
        finally:
            loader.shutdown(wait=False)
        counted = adapter.memory_bytes() or grown
        await loop.run_in_executor(self._forward, adapter.warmup)
        if self._verify is not None and ref is not None:
            served = await loop.run_in_executor(self._forward, self._verify.judge, adapter, ref)
            del ref
            if served is not adapter:  # the gate swapped in its fp32 reference
                mapped = 0  # (it is not on the mapped copy)
                rt = served.runtime
                self.profile = replace(self.profile, runtime=rt.name, precision=rt.precision)
                counted = served.memory_bytes() or counted
            adapter = served
        if self.profile.memory_bytes:  # the tuner measured weights plus peak
            peak = max(0, self.profile.memory_bytes - counted)
        elif self._measure is not None:  # (``measure`` keeps what it measured)
            peak = await loop.run_in_executor(self._forward, self._measure, adapter)
        else:
            peak = 0
        cost = watch.done()  # the gate's reference is let go: what stays, and the moment's
        # at least what a wake brings back (and a sleep lets go): the mapped weights
        weights = max(cost.weights(counted), mapped)
        if self._estimate is not None:
            if cost.own and cost.grown > 0:  # measured alone: kept for the next process
                self._estimate.remember(weights)
            else:  # beside other loads: the count, or what a load alone measured
                weights = max(weights, self._estimate())
        state = self.state_bytes(adapter)
        transient = cost.transient
        if not cost.steady and self._measured is not None:  # others' memory moved in it
            transient = min(transient, self._measured.load)
        held = Footprint(weights, peak, transient, state)
        self.memory = {
            "weights": weights, "counted": counted, "resident_growth": cost.grown,
            "activation_peak": peak, "load_transient": transient, "kv_cache": state,
        }  # fmt: skip
        self._family = adapter
        self._measured = held
        self._mapped = mapped
        self.loaded = self.ever_loaded = True
        return held

    def _map(self, family: AnyFamily) -> int:
        """Put the weights on a mapped copy (``mapped.py``), where the runtime can; the
        bytes mapped. A copy that cannot be written (a full disk) leaves the model as it
        loaded: it is evicted instead of put to sleep."""
        if isinstance(rt := family.runtime, Sleeps):
            try:
                return rt.prepare_sleep()
            except OSError as exc:
                log.warning("%s: weights left unmapped (it cannot sleep): %s", self.spec.id, exc)
        return 0

    @property
    def sleeps(self) -> bool:
        """Loaded on a mapped copy of its weights: ``sleep`` would let them go."""
        family = self._family
        return (
            self.loaded and self._mapped > 0 and family is not None
            and isinstance(family.runtime, Sleeps)
        )  # fmt: skip

    def sleep(self) -> int:
        """Let the weights' memory go and keep the loaded model, to wake in milliseconds;
        the bytes let go (0: it cannot sleep, and the fleet unloads it instead). Its
        LoRA adapters leave as on ``unload``."""
        family = self._family
        if not self.loaded or family is None or not isinstance(rt := family.runtime, Sleeps):
            return 0
        released = rt.sleep()
        moved()
        if released:
            self.adapters.unhost()
            self.loaded, self.sleeping = False, True
        return released

    async def _woken(self) -> Footprint | None:
        """A sleeping model's weights back in memory: what its load measured (``None``:
        the wake failed, and it is dropped for a load)."""
        family, measured = self._family, self._measured
        try:
            if family is None or measured is None or not isinstance(rt := family.runtime, Sleeps):
                raise RuntimeError("nothing to wake")
            moved()
            await asyncio.to_thread(rt.wake)
        except Exception as exc:
            log.warning("%s: the wake failed (%s); loading it again", self.spec.id, exc)
            self.unload()
            return None
        self.sleeping, self.loaded = False, True
        return measured

    def state_bytes(self, family: AnyFamily) -> int:
        """What the model keeps beside its weights as it serves, at its full budget
        (a generation runner's KV cache); 0 for a runner of batches."""
        return 0

    def cannot_adopt(self) -> str:
        """Why the served profile cannot change now ("" when it can): a runner of
        batches swaps between any two of them."""
        return ""

    def adopt(self, other: Self) -> None:
        """Serve ``other``'s profile from now on (``worker.swap``; on the event loop,
        so that no batch starts halfway): its adapter, loaded (or none, when neither is
        loaded: the next load builds it with ``other``'s factory), its factory, profile
        (also what ``unload`` goes back to), measured footprint, memory figures and its
        verify, measure and estimate closures. The old adapter is dropped here; a batch
        already given it keeps its own reference and finishes on it. ``other`` is spent:
        it was only the carrier of the new profile, and lets go of the adapter. Adapters
        hot in the old adapter's bank heat again on use (``AdapterHosting.rehost``); the torch
        copy stays."""
        if type(other) is not type(self) or other.spec.id != self.spec.id:
            raise TypeError(f"model {self.spec.id} adopts only a {type(self).__name__} of itself")
        if other.loaded != self.loaded:
            raise ValueError(f"model {self.spec.id}: a loaded runner adopts a loaded one only")
        old = self._family
        self.sleeping = False  # a sleeping one adopts as if cold: it loads the new one
        self._family, self._factory = other._family, other._factory
        self.profile, self._profile0 = other.profile, other._profile0
        self._measured, self._estimated = other._measured, other._estimated
        self.memory = dict(other.memory)
        self._verify, self._measure, self._estimate = other._verify, other._measure, other._estimate
        other._family, other.loaded = None, False  # served here only: it leaves with us
        self.adapters.rehost(old)

    def refigure(self, other: Self) -> None:
        """Take ``other``'s profile (and what ``unload`` goes back to) without its
        adapter: the tuner kept the engine and batch budget that run, and its profile
        brings the fitted cost model, priority cap and memory figure. What was measured
        at the last load stays; an engine the load gate put in place stays too."""
        if type(other) is not type(self) or other.spec.id != self.spec.id:
            raise TypeError(f"model {self.spec.id} takes only a {type(self).__name__}'s figures")
        served = self.profile
        self.profile = other.profile
        if served != self._profile0:  # the gate serves its fp32 reference
            rt, prec = served.runtime, served.precision
            self.profile = replace(other.profile, runtime=rt, precision=prec)
        self._profile0 = other._profile0

    def unload(self) -> None:
        """Drop the adapter (the fleet frees the memory after): it loads again on use."""
        self.adapters.unhost()
        if self._family is not None:
            moved()
        self._family = None
        self.loaded = self.sleeping = False
        self.profile = self._profile0
