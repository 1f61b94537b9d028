"""Runtimes behind one protocol. Each implementation lives in its own module and
imports its heavy dependency behind a clear "install the extra" error."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..catalog.names import RUNTIMES
from .base import (
    Autocasting,
    BatchGeneratingRuntime,
    GeneratingRuntime,
    Generation,
    Head,
    ModuleRuntime,
    Output,
    Runtime,
    SamplingParams,
    Sleeps,
)
from .cache import DEFAULT_CACHE

log = logging.getLogger("fleetserve.runtimes")

# OpenVINO's converter reports every conversion to Google Analytics (openvino-telemetry:
# on unless a consent file or a CI variable says no), from a process it forks for each
# report. A server calls out to nobody unasked, and ours may have no route out (a
# model hub is not reachable either): with that module unimportable, before any of our
# runtimes imports openvino, the converter takes its own no-op stub.
# (a None entry is what makes an import fail; typeshed allows only modules there)
sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]

if TYPE_CHECKING:  # each implementation serves its protocols (checked, never imported here)
    from .external import ExternalRuntime
    from .onnx import OnnxRuntime
    from .openvino import OpenVinoRuntime
    from .torch import TorchRuntime

    _torch: type[ModuleRuntime] = TorchRuntime
    _torch_sleeps: type[Sleeps] = TorchRuntime
    _onnx: type[Runtime] = OnnxRuntime
    _openvino: type[Runtime] = OpenVinoRuntime
    _external: type[Runtime] = ExternalRuntime
    _external_generates: type[BatchGeneratingRuntime] = ExternalRuntime


def create_runtime(
    name: str,
    *,
    device: str,
    precision: str,
    threads: int = 0,
    cache_dir: Path = DEFAULT_CACHE,
    options: Mapping[str, Any] | None = None,
    adapter_slots: int = 0,
    max_rank: int = 64,
) -> Runtime:
    """A runtime by name. ``cache_dir`` holds exports (ONNX); ``options`` are the model
    spec's ``runtime_options`` (an external server's URL, for example);
    ``adapter_slots``: LoRA slots in the graph for this many adapters a batch, of rank up
    to ``max_rank`` (OpenVINO, ONNX Runtime; 0: none)."""
    if name in ("torch", "torch_compile"):
        from .torch import TorchRuntime

        compile = name == "torch_compile"
        return TorchRuntime(
            device=device, precision=precision, threads=threads, compile=compile,
            cache_dir=cache_dir,
        )  # fmt: skip
    if name == "onnx":
        from .onnx import OnnxRuntime

        guard = float((options or {}).get("int8_min_cosine", 0.999))
        return OnnxRuntime(
            device=device,
            precision=precision,
            threads=threads,
            cache_dir=cache_dir,
            min_cosine=guard,
            adapter_slots=adapter_slots,
            max_rank=max_rank,
        )
    if name == "openvino":
        from .openvino import OpenVinoRuntime

        return OpenVinoRuntime(
            device=device, precision=precision, threads=threads, cache_dir=cache_dir,
            adapter_slots=adapter_slots, max_rank=max_rank,
        )  # fmt: skip
    if name == "external":
        from .external import ExternalRuntime

        return ExternalRuntime(device=device, precision=precision, options=dict(options or {}))
    raise ValueError(f"unknown runtime {name!r}; available: {', '.join(RUNTIMES)}")


# what each runtime's first load imports (transformers builds its models in
# modeling_utils, which ``from transformers import AutoModel`` leaves for later)
_TORCH = (f"{__name__}.torch", "transformers.modeling_utils")
IMPORTS: dict[str, tuple[str, ...]] = {
    "torch": _TORCH,
    "torch_compile": _TORCH,
    "onnx": (f"{__name__}.onnx",),
    "openvino": (f"{__name__}.openvino",),
    "external": (f"{__name__}.external",),
}


def import_runtimes(names: Iterable[str]) -> None:
    """Import what these runtimes' first loads would, ahead of them (so that
    ``fleet.memory.freeze_imports`` can leave it out of every collection). A runtime
    whose extra is missing, or whose library fails to import, is passed over: its
    model's load fails alone and says why."""
    for name in sorted(set(names)):
        for module in IMPORTS.get(name, ()):
            try:
                importlib.import_module(module)
            except Exception as exc:  # ImportError, or a library's OSError or RuntimeError
                log.debug("runtime %s not imported ahead of its loads: %s", name, exc)
                break


__all__ = [
    "Autocasting",
    "BatchGeneratingRuntime",
    "GeneratingRuntime",
    "Generation",
    "Head",
    "ModuleRuntime",
    "Output",
    "Runtime",
    "SamplingParams",
    "Sleeps",
    "create_runtime",
    "import_runtimes",
]
