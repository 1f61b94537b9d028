"""Adapter rows inside the OpenVINO graph: a base's IR with LoRA slots.

Each targeted Linear ``y = W x`` becomes ``y = W x + B_s (A_s x)``, where ``s`` is the
row's slot. Beside the token inputs the graph takes ``lora_slot`` (one int64 per row)
and, for each targeted layer, a stack of ``slots`` A matrices and B matrices, each
transposed (``[slots, in, rank]``, ``[slots, rank, out]``: ``lora_a.<layer>``,
``lora_b.<layer>``); the delta
is a gather of the row's pair and two small matmuls. Slot 0 stays zero: the rows
without an adapter. An adapter's scaling is folded into its B, and a rank below the
layout's is padded with zeros (a zero row of A and column of B add nothing), so
adapters of any rank up to it share one layout.

The stacks are numpy arrays shared with the infer request (``SlotModel``): putting an
adapter into a slot writes its part of them, and nothing is converted or compiled
again. OpenVINO GenAI's adapters (``AdapterConfig``) apply one blend of adapters to a
whole generation pipeline's batch; rows of one batch with different adapters, on an
encoder, are what this adds.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..wire import InvalidInput
from ..wire.values import Array
from .base import Head, Output
from .head_graph import head_graph

if TYPE_CHECKING:
    import torch

SLOT_INPUT = "lora_slot"


@dataclass(frozen=True)
class Layout:
    """The slots of an IR: ``layers`` (module name -> (out, in) of its Linear), how
    many ``slots`` (slot 0, no adapter, among them) and the largest ``rank``."""

    layers: dict[str, tuple[int, int]]
    slots: int
    rank: int

    def a_input(self, layer: str) -> str:
        return f"lora_a.{layer}"

    def b_input(self, layer: str) -> str:
        return f"lora_b.{layer}"


def convert_slots(
    path: Path, head: Head, dest: Path, targets: Sequence[str], slots: int, rank: int
) -> tuple[Layout, tuple[str, ...], tuple[Output, ...]]:
    """Trace ``path``'s head graph with a LoRA slot on every Linear whose name ends
    with one of ``targets`` (a dotted suffix: ``query``, ``attention.output.dense``),
    and save it as IR at ``dest``; its layout, its token inputs and its outputs."""
    import openvino as ov
    import torch

    graph = head_graph(path, head, what="OpenVINO IR with LoRA slots")
    inner: torch.nn.Module = graph.module
    layers: dict[str, tuple[int, int]] = {}
    holder: dict[str, Any] = {}
    for name, module in list(inner.named_modules()):
        if type(module) is torch.nn.Linear and _targeted(name, targets):
            short = name.removeprefix("model.")
            layers[short] = (module.out_features, module.in_features)
            _replace(inner, name, _slot_linear()(module, short, holder))
    if not layers:
        raise InvalidInput(f"no Linear layer of {path} is one of {', '.join(targets)}",
                           field="target_modules")  # fmt: skip
    layout = Layout(layers, slots, rank)
    names = [*graph.inputs, SLOT_INPUT]
    for layer in layers:
        names += [layout.a_input(layer), layout.b_input(layer)]

    class SlotGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            tokens, rest = args[: len(graph.inputs)], args[len(graph.inputs) :]
            holder["slot"] = rest[0]
            for i, layer in enumerate(layers):
                holder[layer] = (rest[1 + 2 * i], rest[2 + 2 * i])
            out: tuple[torch.Tensor, ...] = self.inner(*tokens)
            return out

    stacks = SlotStacks(layout)
    example = graph.example(2, 8)
    feed = [torch.from_numpy(example[n]) for n in graph.inputs]
    feed.append(torch.zeros(2, dtype=torch.int64))
    for layer in layers:
        a, b = stacks.arrays(layer)
        feed += [torch.from_numpy(a), torch.from_numpy(b)]
    shapes: list[tuple[Any, Any]] = [(ov.PartialShape([-1, -1]), ov.Type.i64) for _ in graph.inputs]
    shapes.append((ov.PartialShape([-1]), ov.Type.i64))  # in order: names are set below
    for layer in layers:
        a, b = stacks.arrays(layer)
        shapes += [(ov.PartialShape(list(a.shape)), ov.Type.f32),
                   (ov.PartialShape(list(b.shape)), ov.Type.f32)]  # fmt: skip
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on shape-dependent Python code
        model = ov.convert_model(SlotGraph().eval(), example_input=tuple(feed), input=shapes)
    for port, name in zip(model.inputs, names, strict=True):
        port.get_tensor().set_names({name})
    for port, o in zip(model.outputs, graph.outputs, strict=True):
        port.get_tensor().set_names({str(o)})
    ov.save_model(model, str(dest), compress_to_fp16=False)
    return layout, graph.inputs, graph.outputs


def _targeted(name: str, targets: Sequence[str]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def _replace(root: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


@functools.cache
def _slot_linear() -> type[torch.nn.Module]:
    """The Linear with slots, a class made once torch is imported."""
    import torch

    class SlotLinear(torch.nn.Module):
        """A Linear plus the delta of each row's slot (the stacks come through
        ``holder``, set by the graph's forward from its inputs)."""

        def __init__(self, base: torch.nn.Linear, layer: str, holder: dict[str, Any]) -> None:
            super().__init__()
            self.base, self.layer, self.holder = base, layer, holder

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            slot = self.holder["slot"]
            a, b = self.holder[self.layer]
            rows_a = a.index_select(0, slot)  # [batch, in, rank]
            rows_b = b.index_select(0, slot)  # [batch, rank, out]
            flat = x.reshape(x.shape[0], -1, x.shape[-1])  # [batch, tokens, in]
            delta = torch.bmm(torch.bmm(flat, rows_a), rows_b)
            out: torch.Tensor = self.base(x) + delta.reshape(*x.shape[:-1], delta.shape[-1])
            return out

    return SlotLinear


class SlotStacks:
    """The A and B stacks of a layout, as float32 arrays (slot 0 stays zero)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._a = {n: np.zeros((layout.slots, i, layout.rank), np.float32)
                   for n, (_, i) in layout.layers.items()}  # fmt: skip
        self._b = {n: np.zeros((layout.slots, layout.rank, o), np.float32)
                   for n, (o, _) in layout.layers.items()}  # fmt: skip

    def arrays(self, layer: str) -> tuple[Array, Array]:
        return self._a[layer], self._b[layer]

    def put(self, slot: int, weights: Mapping[str, tuple[Array, Array]], scaling: float) -> None:
        """Slot ``slot`` holds the adapter whose ``weights`` map its layer names (as
        the layout's, or a dotted suffix of one) to (A ``[r, in]``, B ``[out, r]``); its
        other layers, zero. An ``InvalidInput`` for slot 0, a layer outside the
        layout, a rank above it or a shape that is not the layer's."""
        if not 0 < slot < self.layout.slots:
            raise ValueError(f"slot {slot} is not one of 1..{self.layout.slots - 1}")
        given = {self._layer(m): ab for m, ab in weights.items()}
        for layer, (a, b) in given.items():
            out, inp = self.layout.layers[layer]
            r = a.shape[0]
            if r > self.layout.rank:
                raise InvalidInput(f"the adapter's rank {r} is above the slot layout's "
                                   f"{self.layout.rank}", field="rank")  # fmt: skip
            if a.shape != (r, inp) or b.shape != (out, r):
                raise InvalidInput(f"the adapter's {layer} is {a.shape} and {b.shape}, not "
                                   f"({r}, {inp}) and ({out}, {r})", field="weights")  # fmt: skip
        self.clear(slot)
        for layer, (a, b) in given.items():
            r = a.shape[0]
            self._a[layer][slot, :, :r] = a.T
            self._b[layer][slot, :r] = b.T * scaling

    def clear(self, slot: int) -> None:
        for layer in self.layout.layers:
            self._a[layer][slot] = 0.0
            self._b[layer][slot] = 0.0

    def _layer(self, module: str) -> str:
        if module in self.layout.layers:
            return module
        hits = [
            n for n in self.layout.layers if n.endswith("." + module) or module.endswith("." + n)
        ]
        if len(hits) != 1:
            raise InvalidInput(f"the adapter's layer {module} is not one of the slot "
                               "layout's", field="target_modules")  # fmt: skip
        return hits[0]


class SlotModel:
    """An IR with LoRA slots, compiled, its stacks shared with its infer request."""

    def __init__(self, xml: Path, layout: Layout, inputs: Sequence[str],
                 outputs: Sequence[Output], config: Mapping[str, str]) -> None:  # fmt: skip
        import openvino as ov

        self.layout = layout
        self.inputs = tuple(inputs)
        self.stacks = SlotStacks(layout)
        self.compiled = ov.Core().compile_model(str(xml), "CPU", dict(config))
        self.request = self.compiled.create_infer_request()
        self._ports = {o: i for i, o in enumerate(outputs)}
        for layer in layout.layers:
            a, b = self.stacks.arrays(layer)
            self.request.set_tensor(layout.a_input(layer), ov.Tensor(a, shared_memory=True))
            self.request.set_tensor(layout.b_input(layer), ov.Tensor(b, shared_memory=True))

    def run(self, feed: Mapping[str, Array], slots: Array, output: Output) -> Array:
        """``output`` for the token ``feed`` with each row's adapter slot."""
        for name in self.inputs:
            self.request.set_tensor(name, _tensor(feed[name]))
        self.request.set_tensor(SLOT_INPUT, _tensor(slots))
        self.request.infer()
        return np.array(self.request.get_output_tensor(self._ports[output]).data, np.float32)


def _tensor(x: Array) -> Any:
    import openvino as ov

    return ov.Tensor(np.ascontiguousarray(x, dtype=np.int64))


__all__ = ["SLOT_INPUT", "Layout", "SlotModel", "SlotStacks", "convert_slots"]
