"""The tune's last step for a model that takes LoRA adapters: where they run.

Where the winner runs on a runtime with LoRA slots (OpenVINO) and its family takes
adapters in a graph, the tune makes the winner's graph with slots (on the layers
fine-tuning jobs target) and holds it to the slot gate, as it held the winner's
precision to the quality gate: the calibration set with one seeded random adapter on
every row, in the slots, against PEFT's arithmetic on the fp32 torch reference
(``slot_gate.slot_check``). The profile records the verdict (``adapters``):

- ``in_graph``: a server runs adapter rows in the graph without judging it again;
- ``torch``: it runs them on a torch copy, and makes no slots;
- absent (another runtime, a family without adapters, no torch to judge with, or no
  time left): a server judges the slots when it makes them, as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ...catalog.rules import missing_extra
from ...families import AnyFamily, create_family
from ...lora.bases import IN_GRAPH, SLOT_RUNTIMES
from ...runtimes import create_runtime
from ...worker.lora_tier import slot_host
from .options import ADAPTER_S
from .quality import Quality
from .slot_gate import RANK, slot_check

if TYPE_CHECKING:
    from .search import Search

log = logging.getLogger("fleetserve.bench.tune")


def applies(s: Search) -> bool:
    """Whether the winner's adapters could run in its graph (so the step runs)."""
    w = s.winner
    return w is not None and s.spec.family in IN_GRAPH and w.cand.runtime in SLOT_RUNTIMES


async def judge(s: Search) -> None:
    """Set ``s.adapters`` (and ``s.adapter_quality``) for the winner: see the module."""
    s.adapters, s.adapter_quality = "", None
    if not applies(s):
        return
    if missing_extra("torch"):
        s.notes.append("adapters not judged: no torch for the fp32 reference; a server "
                       "judges its slots when it makes them")  # fmt: skip
        return
    if not s.clock.fits(ADAPTER_S, final=True):
        s.notes.append(f"adapters not judged: it needs {ADAPTER_S:.0f}s and "
                       f"{max(0.0, s.clock.left(final=True)):.0f}s of the budget was left; "
                       "a server judges its slots when it makes them")  # fmt: skip
        return
    s.phase = "adapters"
    s._changed()
    try:
        q = await asyncio.to_thread(_check, s)
    except Exception as exc:  # no graph with slots: adapters go to a torch copy
        log.warning("%s: no LoRA slots in its graph (%s): adapters run on a torch copy",
                    s.spec.id, exc)  # fmt: skip
        s.adapters = "torch"
        s.notes.append(f"adapters on a torch copy: no graph with LoRA slots ({exc})")
        return
    s.adapters = "in_graph" if q.passed else "torch"
    s.adapter_quality = q.as_dict()
    if not q.passed:
        s.notes.append(
            f"adapters on a torch copy: the graph with LoRA slots failed the quality gate "
            f"({q.metric} {q.value:.6f}, needs {q.threshold:g})"
        )


def _check(s: Search) -> Quality:
    """The winner with slots against the fp32 torch reference (a loader's work: both
    load here, and both go when it returns)."""
    w = s.winner
    assert w is not None
    candidate = s.family_of(w.cand, adapter_slots=1, max_rank=RANK)
    candidate.load()
    host = slot_host(candidate)
    if host is None:
        raise RuntimeError(f"{w.cand.runtime} has no LoRA slots")
    host.prepare_adapters()
    reference = _reference(s)
    reference.load()
    return slot_check(s.spec, candidate, reference)


def _reference(s: Search) -> AnyFamily:
    runtime = create_runtime("torch", device=s.opts.device, precision="fp32",
                             cache_dir=s.opts.cache_dir)  # fmt: skip
    return create_family(s.spec, runtime, s.path)


__all__ = ["applies", "judge"]
