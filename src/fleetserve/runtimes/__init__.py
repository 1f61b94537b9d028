"""Runtimes behind one protocol. Each implementation lives in its own module and
imports its heavy dependency behind a clear "install the extra" error."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Generation, Head, Output, Runtime, SamplingParams

DEFAULT_CACHE = Path("~/.cache/fleetserve").expanduser()


RUNTIMES = ("torch", "onnx", "external")


def create_runtime(
    name: str,
    *,
    device: str,
    precision: str,
    threads: int = 0,
    cache_dir: Path = DEFAULT_CACHE,
    options: Mapping[str, Any] | None = None,
) -> Runtime:
    """A runtime by name. ``cache_dir`` holds exports (ONNX); ``options`` are the model
    spec's ``runtime_options`` (an external server's URL, for example)."""
    if name == "torch":
        from .torch import TorchRuntime

        return TorchRuntime(device=device, precision=precision, threads=threads)
    if name == "onnx":
        from .onnx import OnnxRuntime

        guard = float((options or {}).get("int8_min_cosine", 0.999))
        return OnnxRuntime(
            device=device,
            precision=precision,
            threads=threads,
            cache_dir=cache_dir,
            min_cosine=guard,
        )
    if name == "external":
        from .external import ExternalRuntime

        return ExternalRuntime(device=device, precision=precision, options=dict(options or {}))
    raise ValueError(f"unknown runtime {name!r}; available: {', '.join(RUNTIMES)}")


def hardware_class(device: str) -> str:
    """The profile key for a device: ``cpu`` or ``cuda``."""
    if device.startswith("cuda"):
        return "cuda"
    if device == "cpu":
        return "cpu"
    try:
        from .torch import hardware_class as torch_hw
    except ImportError:  # an ONNX-only install: no torch, so no CUDA to detect
        return "cpu"
    return torch_hw(device)


__all__ = [
    "RUNTIMES",
    "Generation",
    "Head",
    "Output",
    "Runtime",
    "SamplingParams",
    "create_runtime",
    "hardware_class",
]
