"""The quality gate of adapters run in a model's graph, with LoRA slots (OpenVINO, ONNX
Runtime).

Before adapters run in a graph with slots, the family's calibration set runs twice with
one seeded random adapter on every row: on the slots, and on the fp32 torch reference
running the same adapter (torch's ``LoraBank``, PEFT's arithmetic). The replies are
compared with the tuner's gates (``tune.quality``), as a rule's precision is at load
(``gate.LoadGate``). A pass is kept per weights, precision and hardware class with the
verdicts on disk, so the next start compares nothing; on a failure the model's adapters
run on a torch copy, and one warning says so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from ...catalog import ModelSpec
from ...families import AnyFamily
from ...worker.lora_tier import Bank, host_of
from .gate import Factory, LoadGate
from .quality import Quality, calibration, compare, replies
from .verdicts import Verdicts

if TYPE_CHECKING:
    import torch

log = logging.getLogger("fleetserve.bench.tune")
KEY = "fleetserve/slot-gate@1"  # the gate's adapter, never a tenant's (no tenant has "@1/")
RANK, SEED = 8, 0
# each targeted layer's delta about GAIN times its input's size: enough to move the
# replies (a slot that got every delta 3x came out at cosine 0.99997 with a weak one)
GAIN, SCALING = 0.1, 1.0


class SlotGate(LoadGate):
    """The runner's adapter hosting calls it in two steps, as the load gate's:
    ``prepare`` loads the fp32 reference (on a loader thread; None where the same
    weights passed before), ``passes`` compares (forward passes: on the compute thread,
    between batches). Its verdicts are kept as the load gate's, under the precision
    ``"<precision> with LoRA slots"``."""

    def __init__(
        self,
        spec: ModelSpec,
        precision: str,
        reference: Factory,
        fingerprint: Callable[[], bytes] | None = None,
        verdicts: Verdicts | None = None,
    ) -> None:
        super().__init__(spec, f"{precision} with LoRA slots", reference, fingerprint, verdicts)

    def passes(self, candidate: AnyFamily, reference: AnyFamily) -> bool:
        """Whether the slots of ``candidate`` (its graph's) pass; said in the log."""
        q = slot_check(self.spec, candidate, reference)
        if q.passed:
            log.info("%s: adapters in its graph (%s) passed the quality gate (%s %.6f)",
                     self.spec.id, self.precision, q.metric, q.value)  # fmt: skip
            self._passed = self._judged
            if self.verdicts is not None and self._judged is not None:
                key = self._key(self._judged)
                self.verdicts.record(key, self.spec.id, self.precision, q)
            return True
        self._passed = None
        log.warning(
            "%s: adapters in its graph (%s) fail the quality gate (%s %.6f, needs %g%s); "
            "they run on a torch copy instead",
            self.spec.id, self.precision, q.metric, q.value, q.threshold,
            f"; {q.detail}" if q.detail else "",
        )  # fmt: skip
        return False


def slot_check(spec: ModelSpec, candidate: AnyFamily, reference: AnyFamily) -> Quality:
    """``candidate``'s calibration replies with the gate's adapter on every row, in its
    graph's slots, against ``reference``'s (fp32 torch) with the same adapter."""
    slots, ref = _bank(candidate), _bank(reference)
    layers = _layers(candidate)
    tensors = random_adapter(layers)
    slots.add(KEY, tensors, SCALING)
    ref.add(KEY, tensors, SCALING)
    try:
        requests = calibration(spec)
        want = replies(reference, spec, requests, plan=_every_row(ref))
        got = replies(candidate, spec, requests, plan=_every_row(slots))
    finally:
        slots.remove(KEY)
        ref.remove(KEY)
    return compare(want, got)


def random_adapter(
    layers: Mapping[str, tuple[int, int]],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A seeded LoRA of rank ``RANK`` on ``layers`` (name -> (out, in)): (A, B) tensors."""
    import torch

    rng = np.random.default_rng(SEED)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, (o, i) in sorted(layers.items()):
        a = rng.standard_normal((RANK, i), np.float32) / np.sqrt(i)
        b = rng.standard_normal((o, RANK), np.float32) * (GAIN / np.sqrt(RANK))
        out[name] = (torch.from_numpy(a), torch.from_numpy(b.astype(np.float32)))
    return out


def _bank(family: AnyFamily) -> Bank:
    host = host_of(family)
    if host is None:
        raise RuntimeError(f"a model on {family.runtime.name} that runs no adapters")
    return host.lora_bank()


def _layers(candidate: AnyFamily) -> dict[str, tuple[int, int]]:
    from ...runtimes.graph_slots import GraphSlots

    rt = candidate.runtime
    if not isinstance(rt, GraphSlots):
        raise TypeError(f"{rt.name} has no LoRA slots")
    return dict(rt.lora_bank().model.layout.layers)


def _every_row(bank: Bank) -> Callable[[int], contextlib.AbstractContextManager[None]]:
    from ...lora.mixed import segments_of

    return lambda rows: bank.plan(segments_of([KEY] * rows), rows)


__all__ = ["KEY", "SlotGate", "random_adapter", "slot_check"]
