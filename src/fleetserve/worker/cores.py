"""Where a device process runs: its runtime device and its share of the CPU cores.

Read by the device parent (``devices.py``), each device child (``device_child.py``)
and the tuner's process candidates (``tune.procs``); it imports nothing of theirs.
"""

from __future__ import annotations

import os


def runtime_device(device: str) -> str:
    """``cpu:N`` runs on torch's one CPU device (the cores are split instead)."""
    return "cpu" if device.split(":", 1)[0] == "cpu" else device


def usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def core_share(index: int, n: int, cores: list[int]) -> list[int]:
    """The ``index``-th of ``n`` even slices of ``cores`` (one core each if too few)."""
    if n > len(cores):
        return [cores[index % len(cores)]]
    return cores[index * len(cores) // n : (index + 1) * len(cores) // n]
