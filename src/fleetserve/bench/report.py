"""What every benchmark report records: the machine it ran on, in one line."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path

# the ISA features that change which runtime and precision win (see catalog/hardware.py)
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The speed-relevant ISA flags of /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in _FLAGS if f in have]
    except OSError:
        pass
    return []


def machine() -> str:
    """``<cpu model>, <n> cores, torch <version>, Python <version>`` (torch when installed)."""
    try:
        torch = f", torch {importlib.metadata.version('torch')}"
    except importlib.metadata.PackageNotFoundError:
        torch = ""
    py = platform.python_version()
    return f"{cpu_model()}, {os.cpu_count()} cores{torch}, Python {py}"
