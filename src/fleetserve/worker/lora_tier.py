"""What a worker's adapters are made of: where they come from (``AdapterSource``), what
runs them (an ``AdapterHost`` and its ``Bank``: torch's ``LoraBank``, or the
``SlotBank`` of OpenVINO or ONNX Runtime once a ``SlotHost`` has LoRA slots), and the
hot tier every model of the worker shares (``HotTier``). ``lora_hosting`` puts them
together per runner."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..families import AnyFamily

if TYPE_CHECKING:
    import torch


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


class Held(Protocol):
    """One hot adapter, as its bank keeps it."""

    @property
    def nbytes(self) -> int: ...


class Bank(Protocol):
    """A model's hot adapters where its adapter host keeps them (torch's ``LoraBank``,
    OpenVINO's ``SlotBank``); used from the compute thread."""

    def __contains__(self, key: str) -> bool: ...

    def __len__(self) -> int: ...

    def keys(self) -> list[str]:
        """Least recently used first."""
        ...

    def add(
        self, key: str, tensors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scaling: float
    ) -> Held: ...

    def remove(self, key: str) -> None: ...

    def plan(
        self, segments: Sequence[tuple[str, slice | torch.Tensor]], rows: int
    ) -> contextlib.AbstractContextManager[None]: ...


@runtime_checkable
class AdapterHost(Protocol):
    """A runtime (torch), or a family running its own model (generation), that runs
    mixed-adapter batches."""

    @property
    def takes_adapters(self) -> bool: ...

    def lora_bank(self) -> Bank: ...


@runtime_checkable
class SlotHost(Protocol):
    """A runtime that runs adapters inside its own graph once it has LoRA slots on
    their layers (``runtimes.graph_slots``: OpenVINO, ONNX Runtime): then it is an
    ``AdapterHost`` (``takes_adapters``)."""

    @property
    def in_graph(self) -> bool:
        """Whether it may (False also once making its slots failed)."""
        ...

    @property
    def takes_adapters(self) -> bool: ...

    def covers(self, modules: Sequence[str]) -> bool:
        """Whether its graph has slots on each of ``modules`` now."""
        ...

    def prepare_adapters(self, modules: Sequence[str] = ()) -> None:
        """Slots on ``modules`` too (blocking: a loader thread's work)."""
        ...

    def give_up_slots(self) -> None:
        """Run no adapters in its graph from now on (its slots failed the gate)."""
        ...

    def fit_adapters(self) -> bool:
        """Slots on just the layers its hot adapters use (blocking); whether it changed."""
        ...

    def adapter_bytes(self) -> int:
        """What its graph with slots holds."""
        ...


class SlotJudge(Protocol):
    """The quality gate of a graph's new slots, in two steps (``bench.tune.slot_gate``)."""

    def prepare(self) -> AnyFamily | None:
        """The fp32 reference, loaded (a loader thread's work); None: passed before."""
        ...

    def passes(self, candidate: AnyFamily, reference: AnyFamily) -> bool:
        """Whether ``candidate``'s slots pass (on the compute thread)."""
        ...


def slot_host(family: AnyFamily) -> SlotHost | None:
    """``family``'s runtime where it may run adapters in its graph."""
    rt = family.runtime
    return rt if isinstance(rt, SlotHost) and rt.in_graph else None


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
        self._lru: OrderedDict[tuple[str, str], tuple[int, Bank]] = OrderedDict()
        self.busy: Counter[tuple[str, str]] = Counter()  # batches about to run them
        self.pinned: set[tuple[str, str]] = set()  # never evicted
        # model -> bytes of its adapter host beside it: a torch copy or a graph with slots
        self.copies: dict[str, int] = {}
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
        self, model: str, key: str, nbytes: int, bank: Bank, *, pinned: bool = False
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
