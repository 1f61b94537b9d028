"""The runtimes' cache directory. Its entries (ONNX exports, OpenVINO conversions)
are built once per host by :func:`fleetserve.catalog.entries.build_entry`."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CACHE = Path("~/.cache/fleetserve").expanduser()

__all__ = ["DEFAULT_CACHE"]
