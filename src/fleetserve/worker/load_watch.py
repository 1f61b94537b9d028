"""What a load cost the process: the resident growth it leaves, and what it held for
a moment beyond that (the file read beside the tensors built from it, the quality
gate's fp32 reference).

A runtime's own count of a model's bytes is not what the process holds for it: on a
2-core AMD EPYC (cpu-avx2) all-MiniLM-L6-v2 counts 86 MiB on ONNX Runtime and
OpenVINO; alone in a process a load of it left 100-140 MiB resident (130 on OpenVINO),
and evicted, the process went back to within 5 MiB; as the twelfth copy of one model
in a server (ONNX Runtime), each load grew the process by about 48 MiB. So a model is
charged its growth where that growth is the model's alone: not a runtime's first
load in this process (its library and plugins load with it: OpenVINO's first grew the
process 490 MiB, 270 of which stayed after the eviction), not a load that imported
modules, and not one that overlapped another load or another model's sleep, wake or
unload (in a trace of 16 models on a 2-core cpu-avx2, an OpenVINO model of a 4 MiB
file measured 7 to 128 MiB with those beside its loads, 31 MiB alone, and the charges
that followed spread the same trace's loads from 106 to 173). The heap's free pages
are handed back before each reading (``trim_heap``): batches that ran beside the load
freed what they allocated, and glibc kept it.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass

from ..fleet.memory import peak_bytes, reset_peak, rss_bytes, trim_heap

_loaded_runtimes: set[str] = set()  # runtimes that have loaded a model in this process
_starts = itertools.count(1)
_last_start = 0
_in_flight = 0
_moves = 0  # models that let memory go or took it back without a load (unload, sleep, wake)


def moved() -> None:
    """A model let its memory go or took it back outside a load (an unload, a sleep,
    a wake): a load under way sees its own high-water mark shifted by it."""
    global _moves
    _moves += 1


@dataclass(frozen=True)
class Cost:
    """What one load cost (bytes): the resident growth, the moment's excess over what
    stays, and whether the growth is the model's alone (``own``)."""

    grown: int
    transient: int
    own: bool
    steady: bool = True  # nothing else loaded, woke, slept or left during it

    def weights(self, counted: int) -> int:
        """What to charge for weights that the runtime counts as ``counted``: the
        growth where it is the model's own, else the count (or the growth, where the
        runtime counts nothing)."""
        if not counted or (self.own and self.grown > 0):
            return self.grown
        return counted


class LoadWatch:
    """Started before a load; ``loaded()`` once the weights (and the gate's reference)
    are in; ``done()`` once the load has let go of what it held for a moment."""

    def __init__(self, runtime: str) -> None:
        global _last_start, _in_flight
        self.runtime = runtime
        self.alone = _in_flight == 0
        self.start = _last_start = next(_starts)
        self.moves = _moves
        _in_flight += 1
        self.modules = len(sys.modules)
        self.first = runtime not in _loaded_runtimes
        trim_heap()  # what the heap holds free is not the process's (nor, after, the model's)
        self.before = rss_bytes()
        reset_peak()  # the load's own high-water mark
        self.grown = 0
        self.high = 0
        self._open = True

    def loaded(self) -> int:
        """The weights are in: the resident growth so far (what the runtime counts
        falls back on it)."""
        self.high = peak_bytes()
        self.grown = max(0, rss_bytes() - self.before)
        return self.grown

    def done(self) -> Cost:
        """The load is over: its cost. Call it once."""
        global _in_flight
        if self._open:
            self._open = False
            _in_flight -= 1
        trim_heap()  # what the load and the batches beside it let go of, handed back
        now = rss_bytes()
        steady = self.alone and _last_start == self.start and _moves == self.moves
        own = steady and not self.first and len(sys.modules) == self.modules
        _loaded_runtimes.add(self.runtime)
        transient = max(0, self.high - now) if self.high else 0
        return Cost(max(0, now - self.before), transient, own, steady)

    def abandon(self) -> None:
        """The load failed: it is no longer in flight."""
        global _in_flight
        if self._open:
            self._open = False
            _in_flight -= 1


__all__ = ["Cost", "LoadWatch"]
