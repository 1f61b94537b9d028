"""The quality gate at load, for profiles chosen by rules rather than tuned.

A rule picks a precision from the hardware's features without measuring; before the
model serves, its calibration replies are compared with those of the fp32 reference
(torch, or the same runtime at fp32 where torch is not installed), with the same
gates as the tuner's (``tune.quality``). If it fails, the reference serves instead,
and one warning says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...catalog import ModelSpec
from ...families import AnyFamily
from .quality import Quality, calibration, compare, replies

log = logging.getLogger("fleetserve.bench.tune")
Factory = Callable[[], AnyFamily]  # an unloaded adapter


class LoadGate:
    """The runner's ``verify`` hook, in two steps so that a load stays off the compute
    thread: ``prepare`` builds and loads the fp32 reference (on the loader thread),
    ``judge`` compares (forward passes: on the compute thread) and returns the adapter
    to serve: the candidate if it passes, else the reference, warmed up."""

    def __init__(self, spec: ModelSpec, precision: str, reference: Factory) -> None:
        self.spec = spec
        self.precision = precision
        self.reference = reference

    def prepare(self) -> AnyFamily:
        ref = self.reference()
        ref.load()
        return ref

    def judge(self, adapter: AnyFamily, ref: AnyFamily) -> AnyFamily:
        spec, precision = self.spec, self.precision
        q = check(spec, adapter, ref)
        if q.passed:
            log.info("%s: %s passed the quality gate (%s %.6f)", spec.id, precision,
                     q.metric, q.value)  # fmt: skip
            return adapter
        log.warning(
            "%s: the rule's %s fails the quality gate (%s %.6f, needs %g%s); running "
            "%s fp32 instead",
            spec.id, precision, q.metric, q.value, q.threshold,
            f"; {q.detail}" if q.detail else "", ref.runtime.name,
        )  # fmt: skip
        ref.warmup()
        return ref

    def __call__(self, adapter: AnyFamily) -> AnyFamily:
        """Both steps on this thread (the tuner and tests)."""
        return self.judge(adapter, self.prepare())


def gate_at_load(spec: ModelSpec, precision: str, reference: Factory) -> LoadGate:
    return LoadGate(spec, precision, reference)


def check(spec: ModelSpec, adapter: AnyFamily, reference: AnyFamily) -> Quality:
    """``adapter``'s calibration replies against the loaded ``reference``'s."""
    requests = calibration(spec)
    return compare(replies(reference, spec, requests), replies(adapter, spec, requests))


__all__ = ["LoadGate", "check", "gate_at_load"]
