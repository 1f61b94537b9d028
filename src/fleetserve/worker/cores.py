"""The cores this process may run on, and one device process's even share of them:
used by ``fleetserve worker --devices`` and by the tuner's processes per device, which
imports these and not the device process itself."""

from __future__ import annotations

import os


def usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def core_share(index: int, n: int, cores: list[int]) -> list[int]:
    """The ``index``-th of ``n`` even slices of ``cores`` (one core each if too few)."""
    if n > len(cores):
        return [cores[index % len(cores)]]
    return cores[index * len(cores) // n : (index + 1) * len(cores) // n]
