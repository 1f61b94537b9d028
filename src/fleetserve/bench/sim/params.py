"""What the simulation assumes: the cost model, batch budgets, fleet, request mix, search."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...catalog import Catalog, CostModel

POLICIES = ("pull", "push-rr", "push-lor", "push-loc")
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# (weight, fewest items, most items): most requests are single queries, a few are bulk
DEFAULT_MIX: tuple[tuple[float, int, int], ...] = ((0.70, 1, 1), (0.25, 2, 32), (0.05, 33, 256))
# (label, speed, share of the fleet)
MIXED_FLEET: tuple[tuple[str, float, float], ...] = (
    ("L4", 1.0, 0.5),
    ("A100", 2.5, 0.3),
    ("H100", 4.0, 0.2),
)
HOMOGENEOUS: tuple[tuple[str, float, float], ...] = (("1x", 1.0, 1.0),)


@dataclass(frozen=True)
class Params:
    """Everything the simulation assumes, printed with every report."""

    cost: CostModel = field(default_factory=CostModel)
    cost_source: str = "defaults"
    max_batch_tokens: int = 2048
    max_batch_size: int = 32
    max_seq_len: int = 512
    fleet: tuple[tuple[str, float, float], ...] = MIXED_FLEET
    scale_budget: bool = True  # faster workers get proportionally larger batches
    mix: tuple[tuple[float, int, int], ...] = DEFAULT_MIX
    item_tokens: tuple[int, int] = (8, 512)
    requests: int = 20_000
    warmup: float = 0.1  # fraction of requests (by arrival) left out of the metrics
    rtt_ms: float = 0.3  # pull: broker round trip per pull; push: router-to-worker hop
    lag_ms: float = 20.0  # push: how late a router learns what it did not do itself
    routers: int = 1  # push: routers (gateways); 1 is the strongest push baseline
    slo_ms: float | None = None  # p99 target for "throughput at SLO"; None: default_slo_ms
    search_steps: int = 7
    min_load: float = 0.02  # lowest offered load tried, as a fraction of nominal capacity
    overload: float = 1.25  # offered load for the saturation run
    min_goodput: float = 0.98  # completions over arrivals for a load to count as sustained

    def __post_init__(self) -> None:
        if not self.fleet or any(s <= 0 or w < 0 for _, s, w in self.fleet):
            raise ValueError("fleet speeds must be positive and shares non-negative")
        if sum(w for _, _, w in self.fleet) <= 0 or sum(w for w, _, _ in self.mix) <= 0:
            raise ValueError("fleet shares and mix weights must not all be zero")
        if any(lo < 1 or hi < lo for _, lo, hi in self.mix):
            raise ValueError("request sizes need 1 <= fewest <= most")
        if self.item_tokens[0] < 1 or self.item_tokens[1] < self.item_tokens[0]:
            raise ValueError("item tokens need 1 <= shortest <= longest")
        if self.routers < 1:
            raise ValueError("need at least one router")
        if self.requests < 10 or not 0 <= self.warmup < 0.9:
            raise ValueError("need at least 10 requests and a warmup fraction below 0.9")

    @classmethod
    def from_catalog(cls, model: str = DEFAULT_MODEL, hardware: str = "cpu", **kw: Any) -> Params:
        """Cost coefficients, budgets and ``max_seq_len`` from the catalog: the spec's
        ``budgets`` for a kind (``cpu``, ``cuda``), or the profile a class would run."""
        from ...catalog.hardware import detect
        from ...catalog.profiles import Profiles
        from ...catalog.spec import Profile

        spec = Catalog.load().get(model)
        if hardware in ("cpu", "cuda"):
            prof = Profile.from_dict(hardware, spec.budgets.get(hardware, {}))
            source = f"{model} budgets {hardware!r}"
        else:
            choice = Profiles(detect(), hardware).choose(spec)
            prof, source = choice.profile, f"{model} profile {hardware!r} ({choice.how})"
        return cls(
            cost=prof.cost,
            cost_source=source,
            max_batch_tokens=prof.max_batch_tokens,
            max_batch_size=prof.max_batch_size,
            max_seq_len=spec.max_seq_len,
            **kw,
        )

    def describe(self) -> list[str]:
        c = self.cost
        fleet = ", ".join(f"{n} {s:g}x ({w:.0%})" for n, s, w in self.fleet)
        mix = ", ".join(f"{w:.0%} {lo}" + (f"-{hi}" if hi > lo else "") for w, lo, hi in self.mix)
        lo, hi = self.item_tokens
        return [
            f"cost model ({self.cost_source}): batch ms = ({c.fixed_ms:g} + "
            f"{c.per_token_ms:g} x tokens + {c.per_padded_token_ms:g} x max_len x batch) / speed",
            f"batch budget {self.max_batch_tokens} padded tokens and {self.max_batch_size} items "
            f"at 1x, {'scaled by' if self.scale_budget else 'not scaled by'} worker speed",
            f"fleet: {fleet}; a 1x worker runs batches exactly as fast as the cost model "
            f"predicts (the hardware it was fitted on), an Nx worker N times faster",
            f"requests: Poisson arrivals; items per request {mix} (log-uniform in each range); "
            f"{lo}-{hi} tokens per item (log-uniform), cut to max_seq_len {self.max_seq_len}",
            f"{self.requests} requests per run, first {self.warmup:.0%} left out of the metrics",
            f"pull: {self.rtt_ms:g} ms broker round trip per pull, not overlapped with the "
            f"forward; the worker fills its batch window (2 budgets or 2x the batch size cap) "
            f"oldest first from its unfinished requests and whole requests from the queue; "
            f"requests the batch did not touch go back to the head of the queue",
            f"push: {self.rtt_ms:g} ms router-to-worker hop; {self.routers} router(s), each "
            f"seeing its own assignments at once and the rest {self.lag_ms:g} ms late; "
            f"least-outstanding takes the minimum over all workers (ties at random), stronger "
            f"than power-of-two choices",
            f"p99 SLO {self.slo_ms or math.nan:g} ms, and completions >= {self.min_goodput:.0%} "
            f"of arrivals; load in fractions of nominal capacity (full batches, no padding); "
            f"highest load within the SLO by bisection ({self.search_steps} steps); "
            f"saturation = offered {self.overload:g}x nominal capacity",
        ]
