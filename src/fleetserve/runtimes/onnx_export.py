"""Export a checkpoint to ONNX once, cache it, and quantize it to int8 behind a guard.

One graph per (checkpoint, head) carries every output of that head (``OUTPUTS``), with
the reductions (pooling, SPLADE) baked in. A cache entry is
``cache_dir/onnx/<key>/`` holding ``model.onnx``, ``meta.json`` and, once int8 was
asked for, ``model.int8.onnx`` and ``guard.json``. torch is imported only to export.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console

from ..catalog.entries import build_entry
from .base import Head, Output
from .cache import DEFAULT_CACHE, weights_fingerprint
from .head_graph import OUTPUTS, TRACING, head_graph, per_token
from .onnx_guard import DEFAULT_MIN_COSINE, calibration_feeds, compare, session

if TYPE_CHECKING:
    import torch

log = logging.getLogger("fleetserve.runtimes.onnx")

FORMAT = 1  # bump when the exported graph changes shape or meaning
OPSET = 17


@dataclass(frozen=True, slots=True)
class Guard:
    """The int8 graph measured against fp32 on the calibration set."""

    min_cosine: float
    mean_cosine: float
    samples: int
    per_output: dict[str, float]  # the minimum for each output


@dataclass(frozen=True, slots=True)
class Export:
    """A ready cache entry: the graph to load and the precision it runs at."""

    entry: Path
    model: Path
    precision: str
    guard: Guard | None = None


def cache_key(path: Path, head: Head) -> str:
    """Hash of config.json, the weight files' names, sizes and mtimes, the head and the
    export format. Exporter versions are recorded in meta.json, not keyed, so that an
    entry made at install time still loads where torch is not installed."""
    h = hashlib.sha256(f"format={FORMAT};opset={OPSET};head={head}".encode())
    h.update(weights_fingerprint(path))
    return h.hexdigest()[:24]


def export_model(
    path: Path,
    head: Head = Head.BASE,
    outputs: Sequence[Output] | None = None,
    cache_dir: Path = DEFAULT_CACHE,
    precision: str = "fp32",
    *,
    min_cosine: float = DEFAULT_MIN_COSINE,
    console: Console | None = None,
) -> Export:
    """Export ``path`` with ``head`` (if not cached) and, for int8, quantize and guard it.

    ``outputs`` is only checked: the head's graph carries all its outputs. Returns the
    graph to load: int8 when its minimum cosine to fp32 is at least ``min_cosine``,
    else fp32 with a logged warning saying why."""
    head = Head(head)
    if precision not in ("fp32", "int8"):
        raise ValueError(f"the onnx runtime runs fp32 or int8, not {precision!r}")
    wrong = [o for o in outputs or () if Output(o) not in OUTPUTS[head]]
    if wrong:
        have = ", ".join(OUTPUTS[head])
        raise ValueError(f"the {head} head gives {have}, not {', '.join(wrong)}")
    console = console or Console(stderr=True)
    entry = _ensure_fp32(Path(path), head, Path(cache_dir), console)
    if precision == "fp32":
        return Export(entry, entry / "model.onnx", "fp32")
    guard = _read_guard(entry)
    int8 = entry / "model.int8.onnx"
    if guard is None or not int8.is_file():
        with _status(console, f"Quantizing {path} to int8 and checking it against fp32…"):
            guard = _quantize_and_measure(Path(path), head, entry)
    if guard.min_cosine >= min_cosine:
        log.info("int8 kept for %s: min cosine %.6f >= %.6f", path, guard.min_cosine, min_cosine)
        return Export(entry, int8, "int8", guard)
    log.warning(
        "int8 rejected for %s: min cosine to fp32 %.6f < %.6f on %d calibration items; "
        "running fp32",
        path,
        guard.min_cosine,
        min_cosine,
        guard.samples,
    )
    return Export(entry, entry / "model.onnx", "fp32", guard)


# -- the fp32 graph -------------------------------------------------------------------
def _ensure_fp32(path: Path, head: Head, cache_dir: Path, console: Console) -> Path:
    def build(tmp: Path) -> None:
        t0 = time.perf_counter()
        with _status(console, f"Exporting {path} ({head}) to ONNX…"):
            _export_graph(path, head, tmp / "model.onnx")
        meta = {
            "source": str(path),
            "head": str(head),
            "outputs": [str(o) for o in OUTPUTS[head]],
            "opset": OPSET,
            "format": FORMAT,
            "export_seconds": round(time.perf_counter() - t0, 3),
            "versions": {p: _version(p) for p in ("torch", "transformers", "onnxruntime")},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        log.info("exported %s (%s) in %.1fs", path, head, meta["export_seconds"])

    def complete(entry: Path) -> bool:
        return (entry / "meta.json").is_file() and (entry / "model.onnx").is_file()

    return build_entry(cache_dir / "onnx" / cache_key(path, head), complete, build)


def _export_graph(path: Path, head: Head, dest: Path) -> None:
    graph = head_graph(path, head, what="ONNX export")  # a clear ImportError without torch
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in graph.inputs}
    example = graph.tensors(graph.example(2, 8))
    trace_to_onnx(graph.module, example, dest, graph.inputs, head, graph.outputs, axes)
    check = graph.example(3, 11, seed=1)
    graph.check(path, session(dest).run(None, check), graph.reference(check), "ONNX export")


def trace_to_onnx(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    dest: Path,
    inputs: Sequence[str],
    head: Head,
    outputs: Sequence[Output],
    axes: dict[str, dict[int, str]],
) -> None:
    """``module`` traced on ``example`` through the TorchScript exporter, at ``OPSET``,
    to ``dest``: its inputs named, with ``axes`` dynamic, and ``head``'s ``outputs``
    with their batch (and sequence) axes."""
    import torch

    axes = dict(axes)
    for o in outputs:
        axes[str(o)] = {0: "batch", 1: "sequence"} if per_token(head, o) else {0: "batch"}

    with TRACING, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(
            module,
            example,
            str(dest),
            dynamo=False,
            opset_version=OPSET,
            input_names=list(inputs),
            output_names=[str(o) for o in outputs],
            dynamic_axes=axes,
        )


# -- int8 and its guard -------------------------------------------------------------------
def _quantize_and_measure(path: Path, head: Head, entry: Path) -> Guard:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = entry / f".model.int8.{uuid.uuid4().hex[:8]}.onnx"
    try:
        with warnings.catch_warnings(), _quiet_quantizer():
            warnings.simplefilter("ignore")
            quantize_dynamic(
                entry / "model.onnx",
                tmp,
                op_types_to_quantize=["MatMul", "Gather"],
                per_channel=True,
                weight_type=QuantType.QInt8,
            )
        fp32 = session(entry / "model.onnx")
        feeds = calibration_feeds(path, head, {i.name for i in fp32.get_inputs()})
        got = compare(fp32, session(tmp), feeds)
        every = [c for cs in got.values() for c in cs]
        per_output = {n: min(cs) for n, cs in got.items()}
        n = sum(len(f["input_ids"]) for f in feeds)
        guard = Guard(min(every), float(np.mean(every)), n, per_output)
        os.replace(tmp, entry / "model.int8.onnx")
    finally:
        tmp.unlink(missing_ok=True)
    _write_json(entry / "guard.json", {**asdict(guard), "per_channel": True, "weights": "QInt8"})
    return guard


def _read_guard(entry: Path) -> Guard | None:
    try:
        d = json.loads((entry / "guard.json").read_text())
        per_output = {str(k): float(v) for k, v in d["per_output"].items()}
        return Guard(float(d["min_cosine"]), float(d["mean_cosine"]), int(d["samples"]), per_output)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# -- small helpers ----------------------------------------------------------------------
def _write_json(file: Path, data: dict[str, object]) -> None:
    tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, file)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@contextmanager
def _status(console: Console, message: str) -> Iterator[None]:
    if console.is_terminal:
        with console.status(message):
            yield
    else:
        yield


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """Hide the quantizer's chatter on the root logger while it runs."""
    where = os.path.join("onnxruntime", "quantization")

    def keep(record: logging.LogRecord) -> bool:
        return where not in record.pathname

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
