"""Adapter rows inside a compiled graph: a base's head graph with LoRA slots, whatever
engine compiles it (OpenVINO: ``openvino_lora``; ONNX Runtime: ``onnx_lora``).

Each targeted Linear ``y = W x`` becomes ``y = W x + B_s (A_s x)``, where ``s`` is the
row's slot. Beside the token inputs the graph takes ``lora_slot`` (one int64 per row)
and, for each targeted layer, a stack of A matrices and one of B matrices, each
transposed (``[slots, in, rank]``, ``[slots, rank, out]``: ``lora_a.<layer>``,
``lora_b.<layer>``); the delta is a gather of the row's pair and two small matmuls.
Slot 0 stays zero: the rows without an adapter. An adapter's scaling is folded into its
B, and a rank below the stacks' is padded with zeros (a zero row of A and column of B
add nothing), so adapters of any rank up to the layout's share one graph.

The stacks are graph inputs with dynamic slot and rank dimensions, held here as numpy
arrays (``SlotStacks``): putting an adapter into a slot writes its part of them, and
nothing is converted or compiled again. A converted graph is kept per set of layers
beside the served graph's cache entry (``ensure_slots``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..catalog.entries import build_entry
from ..wire import InvalidInput
from ..wire.values import Array
from .base import Head, Output
from .head_graph import HeadGraph, head_graph

if TYPE_CHECKING:
    import torch

SLOT_INPUT = "lora_slot"
# the Linear layers given slots before any adapter asks for others: what fine-tuning
# jobs target on a BERT (``lora.train.trainer.BERT_TARGETS``; a test keeps them equal)
TRAINED = ("query", "key", "value", "dense")
SLOTS_FORMAT = 1  # of a converted graph with slots: a new one converts again


@dataclass(frozen=True)
class Layout:
    """The slots of a graph: ``layers`` (module name -> (out, in) of its Linear), how
    many ``slots`` at most (slot 0, no adapter, among them) and the largest ``rank``.
    The graph itself takes stacks of any number of slots and any rank: these bound what
    its stacks grow to."""

    layers: dict[str, tuple[int, int]]
    slots: int
    rank: int

    def a_input(self, layer: str) -> str:
        return f"lora_a.{layer}"

    def b_input(self, layer: str) -> str:
        return f"lora_b.{layer}"

    def find(self, module: str) -> str | None:
        """The layer an adapter's ``module`` is (its name, or a dotted suffix either
        way); None where there is not exactly one."""
        if module in self.layers:
            return module
        hits = [n for n in self.layers if n.endswith("." + module) or module.endswith("." + n)]
        return hits[0] if len(hits) == 1 else None

    def layer_of(self, module: str) -> str:
        layer = self.find(module)
        if layer is None:
            raise InvalidInput(f"the adapter's layer {module} is not one of the slot "
                               "layout's", field="target_modules")  # fmt: skip
        return layer

    def check(self, layer: str, a: tuple[int, ...], b: tuple[int, ...]) -> None:
        """An ``InvalidInput`` where A of shape ``a`` and B of shape ``b`` do not fit
        ``layer``: a rank above the layout's, or another layer's shape."""
        out, inp = self.layers[layer]
        r = a[0]
        if r > self.rank:
            raise InvalidInput(f"the adapter's rank {r} is above the slot layout's "
                               f"{self.rank}", field="rank")  # fmt: skip
        if a != (r, inp) or b != (out, r):
            raise InvalidInput(f"the adapter's {layer} is {a} and {b}, not "
                               f"({r}, {inp}) and ({out}, {r})", field="weights")  # fmt: skip


class SlotGraph(Protocol):
    """A compiled graph with LoRA slots (one per engine), its stacks shared with it."""

    layout: Layout
    stacks: SlotStacks

    def put(self, slot: int, weights: Mapping[str, tuple[Array, Array]], scaling: float) -> None:
        """As ``SlotStacks.put``: the next ``run`` sees it, nothing is compiled again."""
        ...

    def run(self, feed: Mapping[str, Array], slots: Array, output: Output) -> Array:
        """``output`` for the token ``feed`` with each row's adapter slot."""
        ...


@dataclass(frozen=True)
class SlotTrace:
    """What a converter traces: ``module`` takes the token inputs, ``lora_slot`` and each
    layer's A and B stacks, in the order of ``names``; ``example`` is a feed in that
    order."""

    module: torch.nn.Module
    graph: HeadGraph
    layers: dict[str, tuple[int, int]]
    names: tuple[str, ...]
    example: tuple[torch.Tensor, ...]


def slot_trace(path: Path, head: Head, targets: Sequence[str], what: str) -> SlotTrace:
    """``path``'s head graph with a LoRA slot on every Linear whose name ends with one
    of ``targets`` (a dotted suffix: ``query``, ``attention.output.dense``)."""
    import torch

    graph = head_graph(path, head, what=what)
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
    layout = Layout(layers, 2, 1)
    names = [*graph.inputs, SLOT_INPUT]
    for layer in layers:
        names += [layout.a_input(layer), layout.b_input(layer)]

    class WithSlots(torch.nn.Module):
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

    stacks = SlotStacks(layout, slots=2, rank=1)  # (the graph takes any)
    example = graph.example(2, 8)
    feed = [torch.from_numpy(example[n]) for n in graph.inputs]
    feed.append(torch.zeros(2, dtype=torch.int64))
    for layer in layers:
        a, b = stacks.arrays(layer)
        feed += [torch.from_numpy(a), torch.from_numpy(b)]
    return SlotTrace(WithSlots().eval(), graph, layers, tuple(names), tuple(feed))


@dataclass(frozen=True)
class SlotEntry:
    """A converted graph with slots in the cache: its model file, layers, token inputs
    and outputs."""

    model: Path
    layers: dict[str, tuple[int, int]]
    inputs: tuple[str, ...]
    outputs: tuple[Output, ...]


def ensure_slots(
    path: Path,
    head: Head,
    entry: Path,
    targets: Sequence[str],
    convert: Callable[[Path, Head, Sequence[str], Path], SlotTrace],
    files: Sequence[str],
) -> SlotEntry:
    """The graph with slots on ``targets`` of the checkpoint ``path`` whose served graph
    is the cache entry ``entry``, converted there once (``<entry>/lora/<targets'
    hash>``) by ``convert(path, head, targets, directory)``, which writes ``files`` (the
    model file first)."""
    key = hashlib.sha256(f"{SLOTS_FORMAT}\0{head}\0{chr(0).join(sorted(targets))}".encode())
    where = entry / "lora" / key.hexdigest()[:16]

    def complete(d: Path) -> bool:
        return all((d / f).is_file() for f in (*files, "slots.json"))

    def build(tmp: Path) -> None:
        trace = convert(path, head, targets, tmp)
        meta = {"targets": sorted(targets), "layers": trace.layers,
                "inputs": list(trace.graph.inputs),
                "outputs": [str(o) for o in trace.graph.outputs]}  # fmt: skip
        (tmp / "slots.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")

    build_entry(where, complete, build)
    meta = json.loads((where / "slots.json").read_text(encoding="utf-8"))
    layers = {str(n): (int(o), int(i)) for n, (o, i) in meta["layers"].items()}
    outputs = tuple(Output(o) for o in meta["outputs"])
    return SlotEntry(where / files[0], layers, tuple(meta["inputs"]), outputs)


def _targeted(name: str, targets: Sequence[str]) -> bool:
    """``name`` is a target, or one names the other with a prefix more."""
    return any(name == t or name.endswith("." + t) or t.endswith("." + name) for t in targets)


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
    """The A and B stacks of a layout, as float32 arrays (slot 0 stays zero), as many
    slots and as large a rank as what was put in them needs (``version`` counts the
    times they grew: the arrays were replaced)."""

    def __init__(self, layout: Layout, slots: int = 1, rank: int = 1) -> None:
        self.layout = layout
        self.slots, self.rank, self.version = 0, 0, 0
        self._a: dict[str, Array] = {}
        self._b: dict[str, Array] = {}
        self.ensure(slots, rank)

    def arrays(self, layer: str) -> tuple[Array, Array]:
        return self._a[layer], self._b[layer]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._a.values()) + sum(b.nbytes for b in self._b.values())

    def ensure(self, slots: int, rank: int) -> None:
        """Room for ``slots`` slots (doubling) and rank ``rank`` (what it is put in)."""
        if slots <= self.slots and rank <= self.rank:
            return
        new_slots = self.slots
        if slots > self.slots:
            new_slots = min(self.layout.slots, max(slots, 2 * self.slots))
        new_rank = max(rank, self.rank)
        for n, (o, i) in self.layout.layers.items():
            a = np.zeros((new_slots, i, new_rank), np.float32)
            b = np.zeros((new_slots, new_rank, o), np.float32)
            if self.slots:
                a[: self.slots, :, : self.rank] = self._a[n]
                b[: self.slots, : self.rank] = self._b[n]
            self._a[n], self._b[n] = a, b
        self.slots, self.rank, self.version = new_slots, new_rank, self.version + 1

    def put(self, slot: int, weights: Mapping[str, tuple[Array, Array]], scaling: float) -> None:
        """Slot ``slot`` holds the adapter whose ``weights`` map its layer names (as
        the layout's, or a dotted suffix of one) to (A ``[r, in]``, B ``[out, r]``); its
        other layers, zero. An ``InvalidInput`` for a layer outside the layout, a rank
        above it or a shape that is not the layer's; a ``ValueError`` for slot 0."""
        if not 0 < slot < self.layout.slots:
            raise ValueError(f"slot {slot} is not one of 1..{self.layout.slots - 1}")
        given = {self.layout.layer_of(m): ab for m, ab in weights.items()}
        for layer, (a, b) in given.items():
            self.layout.check(layer, a.shape, b.shape)
        self.ensure(slot + 1, max((a.shape[0] for a, _ in given.values()), default=1))
        self.clear(slot)
        for layer, (a, b) in given.items():
            r = a.shape[0]
            self._a[layer][slot, :, :r] = a.T
            self._b[layer][slot, :r] = b.T * scaling

    def clear(self, slot: int) -> None:
        if slot >= self.slots:
            return
        for layer in self.layout.layers:
            self._a[layer][slot] = 0.0
            self._b[layer][slot] = 0.0


__all__ = [
    "SLOT_INPUT",
    "TRAINED",
    "Layout",
    "SlotEntry",
    "SlotGraph",
    "SlotStacks",
    "SlotTrace",
    "ensure_slots",
    "slot_trace",
]
