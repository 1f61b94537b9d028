"""Throughput and latency over a recent window, from the replies a gateway sees.

The gateway calls :meth:`Recent.observe` once per answered request (its model and its
total time). The fleet view reads :meth:`Recent.summary`: per model, the requests in
the last ``window_s`` seconds with their exact p50 and p99 (nearest rank, not
histogram estimates), and the rate over the last ``rate_s`` seconds (shorter, so that
it follows the load). In embedded and distributed mode alike the gateway sees every
reply, so nothing has to come back from the workers for these figures.

Memory is bounded: at most ``per_model`` observations are kept per model; when a
model answers faster than that in one window, its rate is taken over the span kept.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 30.0
RATE_S = 10.0
PER_MODEL = 20_000


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ascending values; None if empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class Recent:
    """Answered requests per model over the last ``window_s`` seconds."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        rate_s: float = RATE_S,
        per_model: int = PER_MODEL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.rate_s = min(rate_s, window_s)
        self.per_model = per_model
        self.clock = clock
        self.started = clock()
        self._seen: dict[str, deque[tuple[float, float]]] = {}
        self._total: dict[str, int] = {}
        self._lock = threading.Lock()  # observed on the loop, read from a thread maybe

    def observe(self, model: str, seconds: float) -> None:
        """One answered request of ``model`` that took ``seconds`` end to end."""
        now = self.clock()
        with self._lock:
            d = self._seen.get(model)
            if d is None:
                d = self._seen[model] = deque(maxlen=self.per_model)
            d.append((now, seconds))
            self._total[model] = self._total.get(model, 0) + 1

    def summary(self) -> dict[str, dict[str, object]]:
        """``{model: {requests, total, rps, p50_ms, p99_ms}}`` for every model seen;
        ``requests`` (and the percentiles) are those in the window, ``rps`` the rate
        over the last ``rate_s`` seconds, ``total`` all since start."""
        now = self.clock()
        cutoff = now - self.window_s
        out: dict[str, dict[str, object]] = {}
        with self._lock:
            for model, d in self._seen.items():
                while d and d[0][0] < cutoff:
                    d.popleft()
                lat = sorted(s for _, s in d)
                since = now - self.rate_s
                recent = sum(1 for t, _ in reversed(d) if t >= since) if d else 0
                span = min(self.rate_s, now - self.started)
                if len(d) == d.maxlen and d[0][0] > since:  # truncated: over what is kept
                    span = now - d[0][0]
                p50, p99 = percentile(lat, 0.50), percentile(lat, 0.99)
                out[model] = {
                    "requests": len(lat),
                    "total": self._total[model],
                    "rps": recent / max(span, 1.0),
                    "p50_ms": None if p50 is None else p50 * 1e3,
                    "p99_ms": None if p99 is None else p99 * 1e3,
                }
        return out


__all__ = ["RATE_S", "WINDOW_S", "Recent", "percentile"]
