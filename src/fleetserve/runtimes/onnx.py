"""The ONNX Runtime runtime: small install, fast cold start, fp32 or guarded int8.

``load`` finds (or makes, see ``onnx_export``) the cached graph of the checkpoint's
head, which carries every output of that head with pooling and SPLADE baked in, and
opens one session on it. int8 is used only when the cached guard passed; otherwise
the runtime runs fp32 and logs why. Call ``run`` from one thread: ONNX Runtime
releases the GIL during the forward pass.

Adapters run inside the graph (``adapter_slots`` > 0, at fp32): ``prepare_adapters``
exports, beside the served graph, one with LoRA slots on the targeted Linear layers
(``onnx_lora``, ``graph_slots``), and opens a session on it; a batch planned with adapter
rows runs there, base-only batches on the served graph. An int8 graph takes no slots
(its adapters run on a torch copy): the rows with adapters would run at another
precision than the rest.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

try:
    import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the ONNX runtime needs onnxruntime and onnx: pip install 'fleetserve[onnx]'"
    ) from exc
from rich.console import Console

from ..wire.values import Array
from .base import Head, Output
from .cache import DEFAULT_CACHE
from .engines import OrtSession, Provider
from .graph_slots import GraphSlots
from .onnx_guard import DEFAULT_MIN_COSINE, session

if TYPE_CHECKING:
    from .lora_slots import Layout, SlotEntry
    from .onnx_export import Export
    from .onnx_lora import OnnxSlotModel

log = logging.getLogger("fleetserve.runtimes.onnx")

PRECISIONS = ("fp32", "int8")


class OnnxRuntime(GraphSlots):
    name = "onnx"

    def __init__(
        self,
        device: str = "auto",
        precision: str = "fp32",
        threads: int = 0,
        cache_dir: Path = DEFAULT_CACHE,
        *,
        min_cosine: float = DEFAULT_MIN_COSINE,
        console: Console | None = None,
        adapter_slots: int = 0,
        max_rank: int = 64,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"the onnx runtime runs {' or '.join(PRECISIONS)}, not {precision!r}")
        self.device = _resolve(device)
        self.requested_precision = precision
        self.precision = precision  # what runs once loaded: int8 falls back to fp32
        self.threads = threads
        self.cache_dir = Path(cache_dir)
        self.min_cosine = min_cosine
        self.console = console
        self.head = Head.BASE
        self.export: Export | None = None  # the cache entry in use, with the int8 guard
        self._session: OrtSession | None = None
        self._outputs: tuple[Output, ...] = ()
        self._types = False
        self._bytes = 0
        self._init_slots(adapter_slots, max_rank)  # LoRA in the graph (0 slots: none)

    def load(self, path: Path, head: Head = Head.BASE) -> None:
        head = Head(head)
        precision = self.requested_precision
        if precision == "int8" and self.device != "cpu":
            log.warning("int8 is a CPU feature of ONNX Runtime; running fp32 on %s", self.device)
            precision = "fp32"
        exp, sess = self._open(Path(path), head, precision)
        self._session, self.export, self.head = sess, exp, head
        self.precision = exp.precision
        self._outputs = tuple(Output(o.name) for o in sess.get_outputs())
        self._types = "token_type_ids" in {i.name for i in sess.get_inputs()}
        self._bytes = exp.model.stat().st_size
        self._loaded_slots(Path(path), head, exp.entry)
        if self.precision != "fp32":
            self.adapter_slots = 0  # (see the module: an int8 graph's adapters on torch)

    def _open(self, path: Path, head: Head, precision: str) -> tuple[Export, OrtSession]:
        """The cached graph and a session on it; an entry that does not load is rebuilt once."""
        from .onnx_export import export_model

        for attempt in range(2):
            exp = export_model(
                path,
                head,
                cache_dir=self.cache_dir,
                precision=precision,
                min_cosine=self.min_cosine,
                console=self.console,
            )
            try:
                return exp, session(exp.model, _providers(self.device), self.threads)
            except Exception as exc:  # onnxruntime's errors derive from Exception only
                if attempt or not _is_ort_error(exc):
                    raise
                log.warning("cache entry %s does not load (%s); rebuilding it", exp.entry, exc)
                shutil.rmtree(exp.entry, ignore_errors=True)
        raise AssertionError("unreachable")

    def run(
        self,
        input_ids: Array,
        attention_mask: Array,
        output: Output,
        token_type_ids: Array | None = None,
    ) -> Array:
        if self._session is None:
            raise RuntimeError("model is not loaded")
        output = Output(output)
        if output not in self._outputs:
            have = ", ".join(self._outputs)
            raise ValueError(f"the {self.head} head gives {have}, not {output}")
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ascontiguousarray(attention_mask, np.int64)}
        if self._types:
            types = np.zeros_like(ids) if token_type_ids is None else token_type_ids
            feed["token_type_ids"] = np.ascontiguousarray(types, dtype=np.int64)
        bank = self.planned_bank()
        if bank is not None:  # a batch with adapter rows: the graph with slots
            return bank.run(feed, output)
        (out,) = self._session.run([output.value], feed)
        return np.asarray(out, dtype=np.float32)

    # -- adapters in the graph (``GraphSlots``) ------------------------------------------
    def _ensure_slots(
        self, path: Path, head: Head, entry: Path, targets: Sequence[str]
    ) -> SlotEntry:
        from .onnx_lora import ensure_slots

        return ensure_slots(path, head, entry, targets)

    def _compile_slots(self, found: SlotEntry, layout: Layout) -> tuple[OnnxSlotModel, int]:
        from .onnx_lora import OnnxSlotModel

        providers = _providers(self.device)
        model = OnnxSlotModel(found.model, layout, found.inputs, providers, self.threads)
        return model, found.model.stat().st_size  # (as the served graph's: its file)

    def memory_bytes(self) -> int:
        """The size of the loaded graph file: its weights, fp32 or int8."""
        return self._bytes


def _is_ort_error(exc: Exception) -> bool:
    return type(exc).__module__.startswith("onnxruntime")


def _resolve(device: str) -> str:
    if device == "auto":
        return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
    return device


def _providers(device: str) -> list[Provider]:
    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError(
            f"device {device}: this onnxruntime has no CUDA (pip install onnxruntime-gpu)"
        )
    index = int(device.partition(":")[2] or 0)
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
