"""What a search records of each candidate it tries: the :class:`Point`, and the one-line
reasons it gives for a rejection."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ...wire import FleetError
from .candidates import Candidate
from .options import TuneError
from .quality import Quality


@dataclass
class Point:
    """One candidate, as tried: the run document's Candidate."""

    cand: Candidate
    status: str = "pending"
    quality: Quality | None = None
    samples: list[float] = field(default_factory=list)
    steal: list[float | None] = field(default_factory=list)  # each sample's CPU steal
    items_per_s: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    reason: str = ""
    load_s: float = 0.0
    knee: dict[str, object] | None = None  # its open-loop sweep, when it had one

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(self.samples) if self.samples else 0.0

    def as_dict(self) -> dict[str, object]:
        out = self.cand.as_dict()
        out.update(
            status=self.status,
            quality=self.quality.as_dict() if self.quality else None,
            tokens_per_s=self.tokens_per_s or None,
            items_per_s=self.items_per_s or None,
            p50_ms=None if self.p50_ms != self.p50_ms else self.p50_ms,
            p99_ms=None if self.p99_ms != self.p99_ms else self.p99_ms,
            samples=self.samples,
            steal=self.steal,
            load_s=round(self.load_s, 2),
            reason=self.reason,
            knee_rps=(self.knee or {}).get("knee_rps"),
            knee_tokens_s=(self.knee or {}).get("knee_tokens_s"),
        )
        return out


CANDIDATE_FAILURES = (ImportError, ValueError, RuntimeError, OSError, FleetError, TuneError)


def failure(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, FleetError) else str(exc)
    return f"{type(exc).__name__}: {text}"[:300]


def own_guard(runtime: object) -> Quality | None:
    """The measured quality behind a runtime's own fallback (ONNX Runtime's int8 guard)."""
    try:
        from ...runtimes.onnx import OnnxRuntime
    except ImportError:
        return None
    if not isinstance(runtime, OnnxRuntime) or runtime.export is None:
        return None
    guard = runtime.export.guard
    if guard is None:
        return None
    return Quality("min_cosine", guard.min_cosine, runtime.min_cosine, False, "int8 guard")


def quality_line(q: Quality) -> str:
    if q.metric == "identical":
        return f"not identical: {q.detail}"
    op = ">=" if q.metric == "min_cosine" else "<="
    detail = f" ({q.detail})" if q.detail else ""
    return f"{q.metric} {q.value:.6g}, needs {op} {q.threshold:g}{detail}"
