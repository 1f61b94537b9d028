"""Short start-up lines: a process that holds 17 models says so in one line that fits
80 columns (the list is at debug level, or in the line itself when it is short)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

log = logging.getLogger("fleetserve.fleet")
SHORT = 3  # models named in the line itself, at most


class Loads(Protocol):
    """A model's runner, as far as the summary reads it."""

    @property
    def loaded(self) -> bool: ...


def ready_summary(runners: Mapping[str, Loads], devices: str | Iterable[str]) -> str:
    """``3 loaded, 14 on demand, device cpu`` (``sentence-transformers/x loaded, device
    cpu`` for one or a few models); each model's state at debug level."""
    loaded = [m for m, r in runners.items() if r.loaded]
    later = [m for m in runners if m not in set(loaded)]
    where = devices if isinstance(devices, str) else ", ".join(devices)
    label = "devices" if "," in where else "device"
    for m in runners:
        log.debug("%s: %s", m, "loaded" if m in loaded else "loads on first use")
    if len(runners) <= SHORT:
        parts = [f"{', '.join(loaded)} loaded"] if loaded else []
        parts += [f"{', '.join(later)} on demand"] if later else []
    else:
        parts = [f"{len(loaded)} loaded", f"{len(later)} on demand"]
    return ", ".join([*parts, f"{label} {where or 'auto'}"])


__all__ = ["ready_summary"]
