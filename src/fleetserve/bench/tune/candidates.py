"""The candidate space: runtimes, precisions, threads, processes and batch budgets.

What is offered depends on the family (which runtimes can run it), the extras that
are installed, and the hardware (a bf16 or fp16 candidate needs no special ISA to
*run*, but the gate and the clock decide whether it stays).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ...catalog import ModelSpec, Profile
from ...catalog.hardware import Hardware
from ...catalog.rules import EXPORT_FAMILIES, missing_extra

# torch_compile is not in the grid: the search probes it once (``Search.compile_probe``)
PRECISIONS: dict[str, tuple[str, ...]] = {
    "torch": ("fp32", "bf16", "fp16"),
    "onnx": ("fp32", "int8"),
    "openvino": ("fp32", "bf16", "fp16"),
}


@dataclass(frozen=True)
class Candidate:
    runtime: str
    precision: str
    threads: int
    processes: int
    max_batch_tokens: int
    max_batch_size: int

    @property
    def id(self) -> str:
        return (
            f"{self.runtime}-{self.precision}-t{self.threads}-p{self.processes}"
            f"-b{self.max_batch_size}x{self.max_batch_tokens}"
        )

    @property
    def engine(self) -> tuple[str, str]:
        """What the quality gate judges: the runtime and precision."""
        return self.runtime, self.precision

    def _fields(self) -> dict[str, Any]:
        """What a candidate sets of a profile."""
        return {
            "runtime": self.runtime,
            "precision": self.precision,
            "threads": self.threads,
            "processes": self.processes,
            "max_batch_tokens": self.max_batch_tokens,
            "max_batch_size": self.max_batch_size,
        }

    def profile(self, hardware_class: str, base: Profile | None = None) -> Profile:
        fields = self._fields()
        if base is not None:
            return replace(base, hardware=hardware_class, **fields)
        return Profile(hardware=hardware_class, **fields)

    def with_batch(self, tokens: int, size: int) -> Candidate:
        return replace(self, max_batch_tokens=tokens, max_batch_size=size)

    def with_threads(self, threads: int, processes: int) -> Candidate:
        return replace(self, threads=threads, processes=processes)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, **self._fields()}


def runtimes_for(spec: ModelSpec, kind: str = "cpu") -> list[tuple[str, str]]:
    """(runtime, reason it is not offered or "") for every local runtime."""
    out = []
    for rt in ("torch", "onnx", "openvino"):
        why = ""
        if rt == "openvino" and kind != "cpu":
            why = "OpenVINO runs on CPUs here"
        elif spec.family != "generate" and rt == "onnx" and spec.family not in EXPORT_FAMILIES:
            why = f"the {spec.family} family does not run on ONNX Runtime"
        elif rt == "openvino" and spec.family not in EXPORT_FAMILIES:
            why = f"the {spec.family} family does not run on OpenVINO"
        elif spec.family == "generate" and rt != "torch":
            why = "generation runs on torch"
        elif missing_extra(rt):
            why = f"not installed (pip install 'fleetserve[{missing_extra(rt)}]')"
        out.append((rt, why))
    return out


def engines(spec: ModelSpec, quick: bool = False, kind: str = "cpu") -> list[tuple[str, str]]:
    """Every (runtime, precision) pair the gate should judge, fp32 torch first."""
    offered = [rt for rt, why in runtimes_for(spec, kind) if not why]
    pairs = [(rt, p) for rt in offered for p in PRECISIONS[rt]]
    if quick:  # the reference and the precisions the rules would pick
        pairs = [(rt, p) for rt, p in pairs if p != "int8" and rt != "onnx"]
    return sorted(pairs, key=lambda e: (e != ("torch", "fp32"), e))


def nearest_first(
    pairs: list[tuple[str, str]],
    pick: tuple[str, str],
    emulated: Callable[[str], bool] = lambda precision: False,
) -> list[tuple[str, str]]:
    """``pairs`` in the order to screen them: the fp32 torch reference, the rules' pick
    (the nearest class's winner), its neighbours (its runtime at other precisions, its
    precision on other runtimes), then the rest; so that a search cut short has
    measured the likeliest winners. A precision the device would ``emulate`` comes after
    every native one (it rarely wins, and each of its windows is slow)."""

    def rank(e: tuple[str, str]) -> tuple[int, tuple[str, str]]:
        if e == ("torch", "fp32"):
            return 0, e
        if e == pick:
            return 1, e
        near = e[0] == pick[0] or e[1] == pick[1]
        return (2 if near else 3) + (2 if emulated(e[1]) else 0), e

    return sorted(pairs, key=rank)


def thread_layouts(hw: Hardware) -> list[tuple[int, int]]:
    """(threads, processes) that use every core: one process with all of them, then
    more processes with fewer threads each (as ``fleetserve worker --devices`` runs)."""
    cores = max(1, hw.cores)
    out = [(cores, 1)]
    for procs in (2, 4):
        if cores % procs == 0 and cores // procs >= 1 and procs <= cores:
            out.append((cores // procs, procs))
    return out


def batch_grid(family: str, kind: str) -> list[tuple[int, int]]:
    """The coarse grid of (max_batch_tokens, max_batch_size), small to large."""
    if family == "generate":
        return [(8192, 2), (8192, 4), (8192, 8)] if kind == "cpu" else [(65536, 32), (65536, 64)]
    if kind == "cuda":
        return [(t, max(32, t // 64)) for t in (8192, 16384, 32768, 65536)]
    return [(t, max(8, t // 32)) for t in (1024, 2048, 4096, 8192)]


def refine(grid: list[tuple[int, int]], best: tuple[int, int]) -> list[tuple[int, int]]:
    """Points half way (geometrically) between ``best`` and its grid neighbours."""
    i = grid.index(best) if best in grid else -1
    out = []
    for j in (i - 1, i + 1):
        if 0 <= j < len(grid) and i >= 0:
            t = round((grid[j][0] * best[0]) ** 0.5 / 64) * 64
            s = max(1, round((grid[j][1] * best[1]) ** 0.5))
            if (t, s) not in grid and (t, s) != best:
                out.append((t, s))
    return out


__all__ = [
    "PRECISIONS",
    "Candidate",
    "batch_grid",
    "engines",
    "refine",
    "runtimes_for",
    "thread_layouts",
]
