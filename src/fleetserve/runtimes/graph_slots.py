"""LoRA slots in a runtime's own compiled graph: what the worker's adapter hosting asks
of a runtime that runs adapters itself (``worker.lora_tier.SlotHost``).

A runtime (OpenVINO, ONNX Runtime) mixes in :class:`GraphSlots` and says how its engine
converts a graph with slots (``_ensure_slots``) and compiles it (``_compile_slots``).
``prepare_adapters`` makes, beside the served graph, one with slots on the Linear layers
fine-tuning jobs target (``lora_slots``); a batch planned with adapter rows runs on it
through its :class:`~fleetserve.runtimes.slot_bank.SlotBank`, and base-only batches stay
on the served graph, at its speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .base import Head

if TYPE_CHECKING:
    from .lora_slots import Layout, SlotEntry, SlotGraph
    from .slot_bank import SlotBank


class GraphSlots:
    """The slots' half of a runtime; ``_init_slots`` in its constructor, and
    ``_loaded_slots`` once it loaded a graph."""

    adapter_slots: int  # slots for this many adapters a batch (0: adapters elsewhere)
    max_rank: int  # the largest rank the stacks grow to
    _bank: SlotBank | None
    _slot_bytes: int
    _served: tuple[Path, Head, Path] | None  # checkpoint, head, the served graph's entry

    def _init_slots(self, adapter_slots: int, max_rank: int) -> None:
        self.adapter_slots, self.max_rank = adapter_slots, max_rank
        self._bank, self._slot_bytes, self._served = None, 0, None

    def _loaded_slots(self, path: Path, head: Head, entry: Path) -> None:
        self._bank, self._slot_bytes, self._served = None, 0, (Path(path), head, entry)

    # -- the engine's part --------------------------------------------------------------
    def _ensure_slots(
        self, path: Path, head: Head, entry: Path, targets: Sequence[str]
    ) -> SlotEntry:
        """The converted graph with slots on ``targets``, cached beside ``entry``."""
        raise NotImplementedError

    def _compile_slots(self, found: SlotEntry, layout: Layout) -> tuple[SlotGraph, int]:
        """``found`` compiled, and the bytes it holds (as ``memory_bytes`` counts the
        served graph's)."""
        raise NotImplementedError

    # -- what the hosting calls ---------------------------------------------------------
    @property
    def in_graph(self) -> bool:
        """Whether adapters may run in this model's graph (once prepared)."""
        return self.adapter_slots > 0

    @property
    def takes_adapters(self) -> bool:
        """Whether its graph has LoRA slots now (``prepare_adapters``)."""
        return self._bank is not None

    def lora_bank(self) -> SlotBank:
        if self._bank is None:
            raise RuntimeError("this model has no LoRA slots yet (prepare_adapters)")
        return self._bank

    def planned_bank(self) -> SlotBank | None:
        """The bank, while a batch with adapter rows is planned on it (``run`` then runs
        the graph with slots)."""
        bank = self._bank
        return bank if bank is not None and bank.planned else None

    def covers(self, modules: Sequence[str]) -> bool:
        """Whether its graph has slots on each of an adapter's ``modules``."""
        return self._bank is not None and self._bank.covers(modules)

    def prepare_adapters(self, modules: Sequence[str] = ()) -> None:
        """LoRA slots on the Linear layers the fine-tuning jobs target and on
        ``modules`` (an adapter's), beside the ones it has: the graph with slots is
        converted once per set of layers and kept in the cache entry, then compiled.
        Blocking (a loader thread's work); a graph with slots already runs on until the
        wider one replaces it between batches. On a failure other than an adapter's
        module that is not a Linear layer (``InvalidInput``), adapters no longer run in
        this graph (``in_graph`` is False) and the error is raised."""
        from .lora_slots import TRAINED
        from .slot_bank import SlotBank

        if self._served is None:
            raise RuntimeError("model is not loaded")
        bank = self._bank
        if bank is not None and bank.covers(modules):
            return
        have = list(bank.model.layout.layers) if bank is not None else list(TRAINED)
        model, nbytes = self._slot_model([*have, *modules], modules)
        if bank is None:
            self._bank = SlotBank(model, self.adapter_slots)
        elif not bank.swap(model):  # (only fit_adapters narrows, and this widens)
            raise RuntimeError("a wider graph with slots does not cover the hot adapters")
        self._slot_bytes = nbytes

    def give_up_slots(self) -> None:
        """No adapters in this graph from now on (its slots failed the gate)."""
        self.adapter_slots, self._bank, self._slot_bytes = 0, None, 0

    def fit_adapters(self) -> bool:
        """Slots on just the layers the hot adapters use, where the graph has them on
        more (each slot costs time on every batch with adapters: MiniLM on OpenVINO
        with slots on query and value ran at 0.90-0.93x of the base graph in process,
        with slots on all six Linear layers of each block at 0.67-0.82x). Converts that
        graph (once per set of layers) and runs on it from the next batch on, unless an
        adapter came meanwhile that needs another layer. Blocking (a loader thread's
        work); True where it swapped."""
        bank = self._bank
        if bank is None:
            return False
        used = bank.used()
        if not used or used >= set(bank.model.layout.layers):
            return False
        model, nbytes = self._slot_model(sorted(used), ())
        if not bank.swap(model):
            return False
        self._slot_bytes = nbytes
        return True

    def _slot_model(self, targets: Sequence[str], modules: Sequence[str]) -> tuple[SlotGraph, int]:
        """The graph with slots on ``targets`` (names or dotted suffixes), compiled, and
        the bytes it holds; an ``InvalidInput`` for one of an adapter's ``modules`` that
        is no Linear layer. On another failure adapters no longer run in this graph, and
        it is raised."""
        from ..wire import InvalidInput
        from .lora_slots import Layout

        assert self._served is not None
        path, head, entry = self._served
        try:
            found = self._ensure_slots(path, head, entry, sorted(set(targets)))
            layout = Layout(found.layers, self.adapter_slots + 1, self.max_rank)
            missing = [m for m in modules if layout.find(m) is None]
            if missing:
                raise InvalidInput(
                    f"the adapter's {', '.join(missing)} is not a Linear layer of {path.name}",
                    field="target_modules",
                )
            return self._compile_slots(found, layout)
        except InvalidInput:
            raise
        except Exception:
            self.adapter_slots = 0
            raise

    def adapter_bytes(self) -> int:
        """What the graph with slots holds, as ``memory_bytes`` counts the served one,
        and the most its stacks grow to with the hot adapters' largest rank (MiniLM, 16
        slots of rank 16 on all six Linear layers of each block: 44 MiB)."""
        bank = self._bank
        return self._slot_bytes + (bank.stack_bytes() if bank is not None else 0)


__all__ = ["GraphSlots"]
