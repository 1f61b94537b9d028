"""Adapter rows inside the OpenVINO graph: a base's IR with LoRA slots (the graph and
its stacks: ``lora_slots``).

``convert_slots`` converts the traced head graph with slots to IR, its slot and rank
dimensions dynamic; ``SlotModel`` compiles it and shares the stacks' arrays with its
infer request, so putting an adapter into a slot compiles nothing. OpenVINO GenAI's
adapters (``AdapterConfig``) apply one blend of adapters to a whole generation
pipeline's batch; rows of one batch with different adapters, on an encoder, are what
this adds.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..wire.values import Array
from .base import Head, Output
from .engines import OvCore
from .head_graph import TRACING
from .lora_slots import (
    SLOT_INPUT,
    Layout,
    SlotEntry,
    SlotStacks,
    SlotTrace,
    slot_trace,
)
from .lora_slots import ensure_slots as ensure_entry

FILES = ("model.xml", "model.bin")


def convert_slots(
    path: Path, head: Head, dest: Path, targets: Sequence[str], slots: int, rank: int
) -> tuple[Layout, tuple[str, ...], tuple[Output, ...]]:
    """Trace ``path``'s head graph with a LoRA slot on every Linear whose name ends
    with one of ``targets`` and save it as IR at ``dest``; its layout (of ``slots`` and
    ``rank``), its token inputs and its outputs."""
    trace = _convert(path, head, targets, dest)
    return Layout(trace.layers, slots, rank), trace.graph.inputs, trace.graph.outputs


def ensure_slots(path: Path, head: Head, entry: Path, targets: Sequence[str]) -> SlotEntry:
    """The IR with slots on ``targets`` beside the served IR's cache entry ``entry``,
    converted there once."""
    return ensure_entry(path, head, entry, targets, _to_dir, FILES)


def _to_dir(path: Path, head: Head, targets: Sequence[str], tmp: Path) -> SlotTrace:
    return _convert(path, head, targets, tmp / FILES[0])


def _convert(path: Path, head: Head, targets: Sequence[str], dest: Path) -> SlotTrace:
    import openvino as ov
    import torch

    trace = slot_trace(path, head, targets, "OpenVINO IR with LoRA slots")
    graph = trace.graph
    shapes: list[tuple[Any, Any]] = [(ov.PartialShape([-1, -1]), ov.Type.i64) for _ in graph.inputs]
    shapes.append((ov.PartialShape([-1]), ov.Type.i64))  # in order: names are set below
    for out_features, in_features in trace.layers.values():  # any number of slots, any rank
        shapes += [(ov.PartialShape([-1, in_features, -1]), ov.Type.f32),
                   (ov.PartialShape([-1, -1, out_features]), ov.Type.f32)]  # fmt: skip
    with TRACING, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on shape-dependent Python code
        model = ov.convert_model(trace.module, example_input=trace.example, input=shapes)
    for port, name in zip(model.inputs, trace.names, strict=True):
        port.get_tensor().set_names({name})
    for port, o in zip(model.outputs, graph.outputs, strict=True):
        port.get_tensor().set_names({str(o)})
    ov.save_model(model, str(dest), compress_to_fp16=False)
    return trace


class SlotModel:
    """An IR with LoRA slots, compiled, its stacks shared with its infer request."""

    def __init__(self, xml: Path, layout: Layout, inputs: Sequence[str],
                 outputs: Sequence[Output], config: Mapping[str, str],
                 core: OvCore | None = None) -> None:  # fmt: skip
        import openvino as ov

        core = core or ov.Core()
        self.layout = layout
        self.inputs = tuple(inputs)
        self.stacks = SlotStacks(layout)
        self.compiled = core.compile_model(str(xml), "CPU", dict(config))
        self.request = self.compiled.create_infer_request()
        self._ports = {o: i for i, o in enumerate(outputs)}
        self._bound = -1  # the stacks' version the request holds

    def put(self, slot: int, weights: Mapping[str, tuple[Array, Array]], scaling: float) -> None:
        self.stacks.put(slot, weights, scaling)

    def run(self, feed: Mapping[str, Array], slots: Array, output: Output) -> Array:
        import openvino as ov

        if self._bound != self.stacks.version:  # they grew: new arrays to share
            for layer in self.layout.layers:
                a, b = self.stacks.arrays(layer)
                self.request.set_tensor(
                    self.layout.a_input(layer), ov.Tensor(a, shared_memory=True)
                )
                self.request.set_tensor(
                    self.layout.b_input(layer), ov.Tensor(b, shared_memory=True)
                )
            self._bound = self.stacks.version
        for name in self.inputs:
            self.request.set_tensor(name, _tensor(feed[name]))
        self.request.set_tensor(SLOT_INPUT, _tensor(slots))
        self.request.infer()
        return np.array(self.request.get_output_tensor(self._ports[output]).data, np.float32)


def _tensor(x: Array) -> Any:
    import openvino as ov

    return ov.Tensor(np.ascontiguousarray(x, dtype=np.int64))


__all__ = ["SlotModel", "convert_slots", "ensure_slots"]
