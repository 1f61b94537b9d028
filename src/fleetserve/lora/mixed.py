"""Mixed-adapter LoRA layers: one forward pass, each row with its own adapter.

A :class:`LoraBank` wraps the ``nn.Linear`` modules that loaded adapters target in a
:class:`MixedLinear`. The base projection runs once for the whole batch; then, for
each segment of rows that share an adapter, that adapter's low-rank delta
``(x @ A.T) @ B.T * scaling`` is added to those rows only (the order of operations
PEFT uses, so one adapter's rows equal PEFT running it alone). Rows without an
adapter get the base output untouched.

The runner sorts a batch by adapter, so segments are contiguous row ranges (views,
no copies); generation's running sequences are not sorted, and their segments are
index tensors. The bank is used from the compute thread only: ``add`` and
``remove`` run there between batches, and ``plan`` sets the segments for one
forward pass.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

Rows = slice | torch.Tensor  # a contiguous range of batch rows, or their indices
Resolve = Callable[[Sequence[str], Sequence[str]], Mapping[str, str]]


@dataclass(slots=True)
class HotAdapter:
    """One adapter in memory: per base module, its A ``[r, in]`` and B ``[out, r]``
    (B multiplied by the scaling once, at load)."""

    key: str
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    scaling: float
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class Segment:
    adapter: HotAdapter
    rows: Rows


@dataclass(slots=True)
class _State:
    plan: tuple[Segment, ...] = ()
    rows: int = 0  # the batch's rows, when a plan is set
    modules: dict[str, MixedLinear] = field(default_factory=dict)


class MixedLinear(nn.Module):
    """An ``nn.Linear`` plus the deltas of the adapters planned for this batch."""

    def __init__(self, base: nn.Linear, name: str, state: _State) -> None:
        super().__init__()
        self.base = base
        self.name = name
        self._state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.base(x)
        if self._state.plan and x.shape[0] != self._state.rows:
            # e.g. DeBERTa projects its shared relative positions with query_proj: a
            # delta there would reach every row, so such a target cannot be mixed
            raise RuntimeError(
                f"adapters target {self.name}, which this model also applies to a tensor "
                f"of {x.shape[0]} rows in a batch of {self._state.rows}: not per row"
            )
        for seg in self._state.plan:
            w = seg.adapter.weights.get(self.name)
            if w is None:
                continue
            a, b = w  # A [r, in]; B [out, r], scaled already
            rows = seg.rows
            if isinstance(rows, slice):
                xs = x[rows].to(a.dtype)
                ys = y[rows]
                if ys.dtype == a.dtype and ys.is_contiguous():
                    flat = ys.view(-1, ys.shape[-1])  # one fused in-place multiply-add
                    flat.addmm_(xs.reshape(-1, xs.shape[-1]) @ a.T, b.T)
                else:
                    y[rows] += ((xs @ a.T) @ b.T).to(y.dtype)
            else:
                xs = x.index_select(0, rows).to(a.dtype)
                y.index_add_(0, rows, ((xs @ a.T) @ b.T).to(y.dtype))
        return y


class LoraBank:
    """The hot tier of one loaded model: its adapters in memory, least recently used
    first, and the wrapped modules they target.

    ``resolve(adapter_modules, model_modules)`` maps an adapter's module names (PEFT's,
    without ``base_model.model.``) to the model's; it raises ``InvalidInput`` naming a
    module that is missing or ambiguous.
    """

    def __init__(self, model: nn.Module, resolve: Resolve, *, dtype: torch.dtype) -> None:
        self.model = model
        self.resolve = resolve
        self.dtype = dtype  # the deltas' dtype (fp32 unless the weights are cast)
        self.device = next(model.parameters()).device
        self._state = _State()
        self._hot: OrderedDict[str, HotAdapter] = OrderedDict()
        self._linears = {n: m for n, m in model.named_modules() if type(m) is nn.Linear}

    # -- the hot tier ---------------------------------------------------------------
    def __contains__(self, key: str) -> bool:
        return key in self._hot

    def __len__(self) -> int:
        return len(self._hot)

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self._hot.values())

    def keys(self) -> list[str]:
        """Least recently used first."""
        return list(self._hot)

    def get(self, key: str) -> HotAdapter:
        hot = self._hot[key]
        self._hot.move_to_end(key)
        return hot

    def add(
        self,
        key: str,
        tensors: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        scaling: float,
    ) -> HotAdapter:
        """Load one adapter: ``tensors`` maps its module names to (A, B)."""
        mapping = self.resolve(list(tensors), list(self._linears))
        weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        nbytes = 0
        for name, (a, b) in tensors.items():
            target = mapping[name]
            a = a.to(self.device, self.dtype).contiguous()
            b = (b.to(self.device, torch.float32) * scaling).to(self.dtype).contiguous()
            self._wrap(target)
            weights[target] = (a, b)
            nbytes += a.numel() * a.element_size() + b.numel() * b.element_size()
        hot = HotAdapter(key, weights, float(scaling), nbytes)
        self._hot[key] = hot
        return hot

    def remove(self, key: str) -> None:
        self._hot.pop(key, None)

    def _wrap(self, name: str) -> None:
        if name in self._state.modules:
            return
        linear = self._linears[name]
        parent_name, _, child = name.rpartition(".")
        parent = self.model.get_submodule(parent_name) if parent_name else self.model
        mixed = MixedLinear(linear, name, self._state)
        setattr(parent, child, mixed)
        self._state.modules[name] = mixed

    # -- one forward pass -----------------------------------------------------------
    @contextlib.contextmanager
    def plan(self, segments: Sequence[tuple[str, Rows]], rows: int) -> Iterator[None]:
        """Within this block, a batch of ``rows`` rows runs each segment's adapter on
        its rows (the others run the base)."""
        plan = []
        for key, where in segments:
            if isinstance(where, torch.Tensor):
                where = where.to(self.device)
            plan.append(Segment(self.get(key), where))
        self._state.plan, self._state.rows = tuple(plan), rows
        try:
            yield
        finally:
            self._state.plan, self._state.rows = (), 0


def segments_of(keys: Sequence[str | None]) -> list[tuple[str, Rows]]:
    """Each adapter's rows in a batch where row ``i`` runs ``keys[i]`` (None: the base):
    a slice where its rows are contiguous, else an index tensor."""
    rows: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        if key is not None:
            rows.setdefault(key, []).append(i)
    out: list[tuple[str, Rows]] = []
    for key, idx in rows.items():
        if idx[-1] - idx[0] + 1 == len(idx):
            out.append((key, slice(idx[0], idx[-1] + 1)))
        else:
            out.append((key, torch.tensor(idx, dtype=torch.long)))
    return out
