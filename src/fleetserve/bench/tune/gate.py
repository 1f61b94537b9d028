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
from .verdicts import Verdicts

log = logging.getLogger("fleetserve.bench.tune")
Factory = Callable[[], AnyFamily]  # an unloaded adapter


class LoadGate:
    """The runner's ``verify`` hook, in two steps so that a load stays off the compute
    thread: ``prepare`` builds and loads the fp32 reference (on the loader thread),
    ``judge`` compares (forward passes: on the compute thread) and returns the adapter
    to serve: the candidate if it passes, else the reference, warmed up."""

    def __init__(
        self,
        spec: ModelSpec,
        precision: str,
        reference: Factory,
        fingerprint: Callable[[], bytes] | None = None,
        verdicts: Verdicts | None = None,
    ) -> None:
        self.spec = spec
        self.precision = precision
        self.reference = reference
        self.fingerprint = fingerprint  # the weights' (config, names, sizes, mtimes), ...
        self.verdicts = verdicts  # the passes kept on disk
        self._passed: bytes | None = None  # the fingerprint of the weights that passed
        self._judged: bytes | None = None  # ... of those being judged

    def prepare(self) -> AnyFamily | None:
        """The fp32 reference, loaded; ``None`` where the same weights passed at an
        earlier load, in this process or (with ``verdicts``) another: a reload after
        an eviction compares nothing again (the reference's load and the forward passes
        were most of a miss), nor does the next process."""
        self._judged = self._print()
        if self._judged is not None and (self._judged == self._passed or self._kept(self._judged)):
            self._passed = self._judged
            log.debug("%s: %s passed the quality gate at an earlier load", self.spec.id,
                      self.precision)  # fmt: skip
            return None
        ref = self.reference()
        ref.load()
        return ref

    def _print(self) -> bytes | None:
        if self.fingerprint is None:
            return None
        try:
            return self.fingerprint()
        except OSError:  # unreadable: judged every time
            return None

    def _key(self, fingerprint: bytes) -> str:
        assert self.verdicts is not None
        return self.verdicts.key(self.spec.id, self.precision, fingerprint)

    def _kept(self, fingerprint: bytes) -> bool:
        return self.verdicts is not None and self.verdicts.passed(self._key(fingerprint))

    def judge(self, adapter: AnyFamily, ref: AnyFamily) -> AnyFamily:
        spec, precision = self.spec, self.precision
        q = check(spec, adapter, ref)
        if q.passed:
            log.info("%s: %s passed the quality gate (%s %.6f)", spec.id, precision,
                     q.metric, q.value)  # fmt: skip
            self._passed = self._judged
            if self.verdicts is not None and self._judged is not None:
                key = self._key(self._judged)
                self.verdicts.record(key, spec.id, precision, q)
            return adapter
        self._passed = None
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
        ref = self.prepare()
        return adapter if ref is None else self.judge(adapter, ref)


def gate_at_load(
    spec: ModelSpec,
    precision: str,
    reference: Factory,
    fingerprint: Callable[[], bytes] | None = None,
    verdicts: Verdicts | None = None,
) -> LoadGate:
    """The gate of a rule's precision; with ``fingerprint``, a verdict that passed is
    kept for the same weights (with ``verdicts``, on disk too)."""
    return LoadGate(spec, precision, reference, fingerprint, verdicts)


def check(spec: ModelSpec, adapter: AnyFamily, reference: AnyFamily) -> Quality:
    """``adapter``'s calibration replies against the loaded ``reference``'s."""
    requests = calibration(spec)
    return compare(replies(reference, spec, requests), replies(adapter, spec, requests))


__all__ = ["LoadGate", "check", "gate_at_load"]
