"""Runtimes behind one protocol. Each implementation lives in its own module and
imports its heavy dependency behind a clear "install the extra" error."""

from __future__ import annotations

from .base import Head, Output, Runtime


def create_runtime(name: str, *, device: str, precision: str, threads: int = 0) -> Runtime:
    if name == "torch":
        from .torch import TorchRuntime

        return TorchRuntime(device=device, precision=precision, threads=threads)
    raise ValueError(f"unknown runtime {name!r}; available: torch")


def hardware_class(device: str) -> str:
    """The profile key for a device: ``cpu`` or ``cuda``."""
    if device.startswith("cuda"):
        return "cuda"
    if device == "cpu":
        return "cpu"
    from .torch import hardware_class as torch_hw

    return torch_hw(device)


__all__ = ["Head", "Output", "Runtime", "create_runtime", "hardware_class"]
