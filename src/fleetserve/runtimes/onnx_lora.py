"""Adapter rows inside the ONNX Runtime graph: a base's head graph with LoRA slots (the
graph and its stacks: ``lora_slots``), exported to ONNX.

``export_slots`` exports the traced head graph with slots, its slot and rank axes
dynamic, beside the served graph's cache entry; ``OnnxSlotModel`` opens a session on it
and feeds the stacks' arrays with each batch, so putting an adapter into a slot exports
and compiles nothing. ONNX Runtime has no LoRA of its own for encoders (onnxruntime-genai
applies adapters to a generation model, one set a batch): the slots are ours, as on
OpenVINO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..wire.values import Array
from .base import Head, Output
from .engines import OrtSession, Provider
from .lora_slots import SLOT_INPUT, Layout, SlotEntry, SlotStacks, SlotTrace, slot_trace
from .lora_slots import ensure_slots as ensure_entry
from .onnx_export import trace_to_onnx
from .onnx_guard import session

FILES = ("model.onnx",)


def ensure_slots(path: Path, head: Head, entry: Path, targets: Sequence[str]) -> SlotEntry:
    """The ONNX graph with slots on ``targets`` beside the served graph's cache entry
    ``entry``, exported there once."""
    return ensure_entry(path, head, entry, targets, _to_dir, FILES)


def _to_dir(path: Path, head: Head, targets: Sequence[str], tmp: Path) -> SlotTrace:
    return export_slots(path, head, targets, tmp / FILES[0])


def export_slots(path: Path, head: Head, targets: Sequence[str], dest: Path) -> SlotTrace:
    """Trace ``path``'s head graph with a LoRA slot on every Linear whose name ends with
    one of ``targets`` and export it to ONNX at ``dest``."""
    trace = slot_trace(path, head, targets, "an ONNX graph with LoRA slots")
    graph = trace.graph
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in graph.inputs}
    axes[SLOT_INPUT] = {0: "batch"}
    for name in trace.names[len(graph.inputs) + 1 :]:  # any number of slots, any rank
        rank = 2 if name.startswith("lora_a.") else 1  # A is [slots, in, rank]
        axes[name] = {0: "slots", rank: "rank"}
    trace_to_onnx(trace.module, trace.example, dest, trace.names, head, graph.outputs, axes)
    return trace


class OnnxSlotModel:
    """An ONNX graph with LoRA slots in a session; its stacks go in with each batch."""

    def __init__(self, model: Path, layout: Layout, inputs: Sequence[str],
                 providers: Sequence[Provider], threads: int = 0) -> None:  # fmt: skip
        self.layout = layout
        self.inputs = tuple(inputs)
        self.stacks = SlotStacks(layout)
        self.session: OrtSession = session(model, list(providers), threads)
        # the inputs the exporter kept: it drops the stacks of a layer no output uses
        # (a BERT's pooler beside the mean pooling of its base head)
        self._takes = {i.name for i in self.session.get_inputs()}

    def put(self, slot: int, weights: Mapping[str, tuple[Array, Array]], scaling: float) -> None:
        self.stacks.put(slot, weights, scaling)

    def run(self, feed: Mapping[str, Array], slots: Array, output: Output) -> Array:
        named: dict[str, Array] = {
            n: np.ascontiguousarray(feed[n], dtype=np.int64) for n in self.inputs
        }
        named[SLOT_INPUT] = np.ascontiguousarray(slots, dtype=np.int64)
        for layer in self.layout.layers:
            a, b = self.stacks.arrays(layer)
            named[self.layout.a_input(layer)], named[self.layout.b_input(layer)] = a, b
        named = {n: v for n, v in named.items() if n in self._takes}
        (out,) = self.session.run([Output(output).value], named)
        return np.asarray(out, dtype=np.float32)


__all__ = ["OnnxSlotModel", "ensure_slots", "export_slots"]
