"""The adapters of a base served with LoRA slots in its graph (OpenVINO, ONNX Runtime).

A :class:`SlotBank` is what the worker's adapter hosting talks to, as it talks to
torch's :class:`~fleetserve.lora.mixed.LoraBank`: ``add`` and ``remove`` run on the
compute thread between batches, and ``plan`` sets, for one batch, the adapter of each
row. The hot adapters are kept here as float32 arrays. A batch's adapters go into slots
of the graph's stacks as it runs: an adapter already in a slot stays there, and a new
one takes a free slot or the least recently used one that no row of this batch needs,
so the hot tier may hold more adapters than there are slots, and a slot is reused only
once the batch that used it is done. A batch with more distinct adapters than slots
runs in parts of contiguous rows.

The graph (a :class:`~fleetserve.runtimes.lora_slots.SlotGraph`) may be replaced by
one with slots on other layers (``swap``, from a loader thread): more, for an adapter
on a layer the graph has none on; fewer, just the ones the hot adapters use (each slot
costs time on every batch with adapters). The next batch takes it up and fills its
slots again from the hot adapters.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..wire.values import Array
from .base import Output
from .lora_slots import SlotGraph

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class SlotAdapter:
    """One hot adapter: per layer of the layout, A ``[r, in]`` and B ``[out, r]``."""

    key: str
    weights: dict[str, tuple[Array, Array]]
    scaling: float
    nbytes: int


class SlotBank:
    """The hot adapters of one model and the slots of its graph they run in."""

    def __init__(self, model: SlotGraph, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a slot bank needs at least one slot, not {capacity}")
        self.capacity = capacity  # slots for adapters (slot 0, no adapter, besides)
        self._model = model
        self._next: SlotGraph | None = None  # a wider layout, taken up between batches
        self._swap = threading.Lock()
        self._hot: OrderedDict[str, SlotAdapter] = OrderedDict()
        self._slots: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._rows: list[str | None] | None = None  # the planned batch's adapters

    # -- the hot adapters -----------------------------------------------------------
    def __contains__(self, key: str) -> bool:
        return key in self._hot

    def __len__(self) -> int:
        return len(self._hot)

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self._hot.values())

    @property
    def model(self) -> SlotGraph:
        """The graph the next batch runs on."""
        with self._swap:
            return self._next or self._model

    def keys(self) -> list[str]:
        return list(self._hot)

    def covers(self, modules: Sequence[str]) -> bool:
        """Whether the graph has slots on every one of these (an adapter's) modules."""
        layout = self.model.layout
        return all(layout.find(m) is not None for m in modules)

    def add(
        self, key: str, tensors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scaling: float
    ) -> SlotAdapter:
        """Keep one adapter: ``tensors`` maps its module names to (A, B). An
        ``InvalidInput`` names a module the layout has no slot on, or a shape that is not
        its layer's."""
        with self._swap:  # the layout it is read against is the one a swap checks
            layout = (self._next or self._model).layout
            weights: dict[str, tuple[Array, Array]] = {}
            for module, (a, b) in tensors.items():
                layer = layout.layer_of(module)
                wa, wb = a.float().numpy(), b.float().numpy()
                layout.check(layer, wa.shape, wb.shape)
                weights[layer] = (wa, wb)
            nbytes = sum(a.nbytes + b.nbytes for a, b in weights.values())
            hot = SlotAdapter(key, weights, float(scaling), nbytes)
            self._hot[key] = hot
        slot = self._slots.pop(key, None)
        if slot is not None:  # (a new version of one in a slot: put again on next use)
            self._model.stacks.clear(slot)
        return hot

    def remove(self, key: str) -> None:
        self._hot.pop(key, None)
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._model.stacks.clear(slot)

    def stack_bytes(self) -> int:
        """The most the graph's stacks grow to with these adapters: every slot at
        their largest rank (the stacks' rank never shrinks while the model is loaded)."""
        layout = self.model.layout
        with self._swap:
            rank = max((a.shape[0] for h in self._hot.values() for a, _ in h.weights.values()),
                       default=0)  # fmt: skip
        per_rank = sum(i + o for o, i in layout.layers.values()) * 4  # float32, A and B
        return (self.capacity + 1) * max(rank, self._model.stacks.rank) * per_rank

    def used(self) -> set[str]:
        """The layers the hot adapters have weights on."""
        with self._swap:
            return {layer for hot in self._hot.values() for layer in hot.weights}

    def swap(self, model: SlotGraph) -> bool:
        """Run the next batches on ``model`` (a layout with other layers), where it has
        slots on every layer of every hot adapter; False where it lacks one (an adapter
        came while it was made)."""
        with self._swap:
            if any(model.layout.find(layer) is None for hot in self._hot.values()
                   for layer in hot.weights):  # fmt: skip
                return False
            self._next = model
            return True

    # -- one batch ------------------------------------------------------------------
    @contextlib.contextmanager
    def plan(
        self, segments: Sequence[tuple[str, slice | torch.Tensor]], rows: int
    ) -> Iterator[None]:
        """Within this block, a batch of ``rows`` rows runs each segment's adapter on its
        rows (the others run the base)."""
        keys: list[str | None] = [None] * rows
        for key, where in segments:
            if key not in self._hot:
                raise KeyError(f"adapter {key} is not hot")
            idx = range(rows)[where] if isinstance(where, slice) else where.tolist()
            for i in idx:
                keys[i] = key
        self._rows = keys
        try:
            yield
        finally:
            self._rows = None

    @property
    def planned(self) -> bool:
        return self._rows is not None

    def run(self, feed: Mapping[str, Array], output: Output) -> Array:
        """``output`` for the planned batch's token ``feed``, each row with its adapter."""
        keys = self._rows
        assert keys is not None, "run outside a plan"
        with self._swap:
            if self._next is not None:  # a wider layout: its slots fill up again
                self._model, self._next = self._next, None
                self._slots.clear()
        outs = []
        for lo, hi in parts(keys, self.capacity):
            slots = self._place(keys[lo:hi])
            part = {n: v[lo:hi] for n, v in feed.items()}
            outs.append(self._model.run(part, slots, output))
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def _place(self, keys: Sequence[str | None]) -> Array:
        """Each row's slot, putting the adapters not in one into a slot first."""
        need = {k for k in keys if k is not None}
        for k in need:
            self._hot.move_to_end(k)
            if k in self._slots:
                self._slots.move_to_end(k)
        taken = set(self._slots.values())
        free = [s for s in range(1, self.capacity + 1) if s not in taken]
        for k in sorted(need - self._slots.keys()):
            if free:
                slot = free.pop(0)
            else:  # the least recently used slot no row of this part needs
                victim = next(v for v in self._slots if v not in need)
                slot = self._slots.pop(victim)
            hot = self._hot[k]
            self._model.put(slot, hot.weights, hot.scaling)
            self._slots[k] = slot
        return np.array([0 if k is None else self._slots[k] for k in keys], np.int64)


def parts(keys: Sequence[str | None], capacity: int) -> list[tuple[int, int]]:
    """Contiguous row ranges of ``keys``, each with at most ``capacity`` distinct
    adapters (one range when the whole batch has that few)."""
    out, lo, seen = [], 0, set[str]()
    for i, k in enumerate(keys):
        if k is not None and k not in seen and len(seen) == capacity:
            out.append((lo, i))
            lo, seen = i, set()
        if k is not None:
            seen.add(k)
    out.append((lo, len(keys)))
    return out


__all__ = ["SlotAdapter", "SlotBank", "parts"]
