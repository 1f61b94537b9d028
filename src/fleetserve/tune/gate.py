"""The quality gate at load, for profiles chosen by rules rather than tuned.

A rule picks a precision from the hardware's features without measuring; before the
model serves, its calibration replies are compared with those of the same runtime
at fp32 (the same gates as the tuner's, ``tune.quality``). If it fails, the model is
loaded again at fp32 and one warning says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..catalog import ModelSpec
from ..families import FamilyAdapter
from .quality import Quality, calibration, compare, replies

log = logging.getLogger("fleetserve.tune")
Factory = Callable[[str], FamilyAdapter]  # precision -> an unloaded adapter


def gate_at_load(
    spec: ModelSpec, precision: str, make: Factory
) -> Callable[[FamilyAdapter], FamilyAdapter]:
    """A ``verify`` hook for the runner: the loaded adapter, or an fp32 one."""

    def verify(adapter: FamilyAdapter) -> FamilyAdapter:
        q = check(spec, adapter, make)
        if q.passed:
            log.info(
                "%s: %s passed the quality gate (%s %.6f)", spec.id, precision, q.metric, q.value
            )
            return adapter
        log.warning(
            "%s: the rule's %s fails the quality gate (%s %.6f, needs %g%s); running fp32",
            spec.id,
            precision,
            q.metric,
            q.value,
            q.threshold,
            f"; {q.detail}" if q.detail else "",
        )
        fp32 = make("fp32")
        fp32.load()
        fp32.warmup()
        return fp32

    return verify


def check(spec: ModelSpec, adapter: FamilyAdapter, make: Factory) -> Quality:
    reference = make("fp32")
    reference.load()
    requests = calibration(spec)
    want = replies(reference, spec, requests)
    del reference
    return compare(want, replies(adapter, spec, requests))


__all__ = ["check", "gate_at_load"]
