"""A model's weights before it loads: what a load of the same weights on the same
engine measured alone, kept on local disk (``<cache_dir>/held``), else their files'
size.

The files' size is what a torch model holds. An engine that builds its own copies holds
more: ONNX Runtime pre-packs its matrices (an 86 MiB export held 127 MiB in its session
on a 2-core cpu-avx2), OpenVINO keeps the weights file mapped beside the compiled
model's copy (twice a 56 MiB IR; its runtime counts that). Reserved at the files' size,
such a model's first load in each process went past the budget by the difference
before the fleet could make room for it; and where loads overlap, the fleet cannot
tell a model's growth from the others' and falls back to the runtime's count. A fact
kept as the activation peaks are (``catalog/facts.py``) makes both right from the
second process on: a restart, a device child, another worker of the host."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..catalog.facts import Facts
from ..fleet.drift import FLOOR
from ..fleet.memory import mib, weights_estimate

log = logging.getLogger("fleetserve.fleet")


class KeptWeights:
    """``Estimate`` (``loadable.py``) over the kept facts. ``key`` gives the fact's key
    (``None``: the weights cannot be keyed yet, and nothing is kept); ``locate`` the
    weights on disk, for the files' size."""

    def __init__(
        self,
        kept: Facts,
        key: Callable[[], str | None],
        locate: Callable[[], Path | None],
        precision: str,
        model: str,
    ) -> None:
        self.kept = kept
        self.key = key
        self.locate = locate
        self.precision = precision
        self.model = model

    def files(self) -> int:
        path = self.locate()
        return weights_estimate(path, self.precision) if path is not None else 0

    def __call__(self) -> int:
        key = self.key()
        found = self.kept.get(key) if key is not None else None
        held = found.get("bytes") if found is not None else None
        return max(held if isinstance(held, int) else 0, self.files())

    def remember(self, weights: int) -> None:
        """Kept where it passes the files' size by more than the resident set's own
        noise (``FLOOR``): a torch model is what its files say, and one whose load
        touched only part of them (a mapped safetensors file, the embedding rows a
        warm-up reads) comes to hold them as it serves. A kept figure is written again
        where a load differs from it by more than that noise and 5 %."""
        key = self.key()
        if key is None:
            return
        found = self.kept.get(key)
        was = found.get("bytes") if found is not None else None
        if not isinstance(was, int):
            if weights <= self.files() + FLOOR:
                return
        elif abs(weights - was) <= max(FLOOR, was // 20):
            return
        self.kept.put(key, {"model": self.model, "bytes": weights})
        log.debug("%s: its weights hold %s as loaded; kept for the next process",
                  self.model, mib(weights))  # fmt: skip


__all__ = ["KeptWeights"]
