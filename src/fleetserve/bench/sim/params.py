"""What the simulation assumes: the cost model, budgets, classes, fleet, request mix, search.

Where the cost model comes from (fitted or assumed) is in ``costs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...catalog import CostModel

POLICIES = ("pull", "push-rr", "push-lor", "push-loc")
PUSH = POLICIES[1:]
LAGS = (0.0, 20.0, 200.0, 1000.0)  # router state lag, ms (the values)
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
    cost_name: str = "custom"  # cpu, gpu
    cost_fitted: bool = False  # True: a profile `fleetserve tune` fitted; False: assumed
    max_batch_tokens: int = 2048
    max_batch_size: int = 32
    max_seq_len: int = 512
    interactive_cost: int = 2048  # the profile's: requests up to this many tokens are interactive
    interactive_tokens: int = 0  # batch cap at 1x while interactive work is about (0: none)
    priority_cap: int = 0  # the profile's field, for the record (see costs.params_for)
    age_limit_ms: float = 2000.0  # batch work this old goes first (settings.batch_age_limit)
    hold_ms: float = 1000.0  # the cap lasts this long after a query (interactive_hold)
    # a worker pulls while it holds fewer budgets than this, for what that leaves (2:
    # worker/loop.py); below 1, it asks for one budget less what it holds (0: when empty)
    high_water: float = 2.0
    full_pull: bool = True  # a full worker still pulls queries (worker/loop.py FULL_POLL)
    fleet: tuple[tuple[str, float, float], ...] = MIXED_FLEET
    scale_budget: bool = True  # faster workers get proportionally larger batches
    mix: tuple[tuple[float, int, int], ...] = DEFAULT_MIX
    item_tokens: tuple[int, int] = (8, 512)
    requests: int = 20_000
    duration_s: float = 0.0  # if longer: enough requests for this long at half capacity
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
        if min(self.lag_ms, self.age_limit_ms, self.hold_ms, self.duration_s) < 0:
            raise ValueError("lag, age limit, hold and duration must be >= 0")
        if self.high_water < 0:
            raise ValueError("high water must be >= 0")

    @property
    def cost_label(self) -> str:
        return f"{self.cost_name} ({'fitted' if self.cost_fitted else 'assumed'})"

    @property
    def interactive_batch_tokens(self) -> int:
        """The batch budget at 1x while interactive work waits (``Profile``'s rule)."""
        return max(1, min(self.interactive_tokens or self.max_batch_tokens, self.max_batch_tokens))

    def describe(self) -> list[str]:
        c = self.cost
        fleet = ", ".join(f"{n} {s:g}x ({w:.0%})" for n, s, w in self.fleet)
        mix = ", ".join(f"{w:.0%} {lo}" + (f"-{hi}" if hi > lo else "") for w, lo, hi in self.mix)
        lo, hi = self.item_tokens
        how = "FITTED" if self.cost_fitted else "ASSUMED (not fitted on that hardware)"
        full = "when full, for queries only (one budget of them), every 20 ms; "
        full = full if self.full_pull else "when full, not at all; "
        return [
            f"cost model {self.cost_name}, {how}: {self.cost_source}; batch ms = "
            f"({c.fixed_ms:g} + {c.per_token_ms:g} x tokens + {c.per_padded_token_ms:g} x "
            f"max_len x batch) / speed",
            f"batch budget {self.max_batch_tokens} padded tokens and {self.max_batch_size} items "
            f"at 1x, {'scaled by' if self.scale_budget else 'not scaled by'} worker speed; "
            f"{self.interactive_batch_tokens} while interactive work waits and "
            f"{self.hold_ms:g} ms after (priority_cap {self.priority_cap}, else a tuned "
            f"profile's 25 ms batch); interactive = cost <= {self.interactive_cost} tokens; "
            f"queries only while any wait, but bulk work gets a batch after "
            f"{self.age_limit_ms:g} ms without one, and a pull lets in a batch request "
            f"that waited that long",
            f"fleet: {fleet}; a 1x worker runs batches exactly as fast as the cost model "
            f"predicts (the hardware it was fitted on), an Nx worker N times faster",
            f"requests: Poisson arrivals; items per request {mix} (log-uniform in each range); "
            f"{lo}-{hi} tokens per item (log-uniform), cut to max_seq_len {self.max_seq_len}; "
            f"cost hint = the request's tokens",
            f"{self.requests} requests per run or, if more, enough for {self.duration_s:g} s of "
            f"arrivals at half the nominal capacity; the first {self.warmup:.0%} (by arrival) "
            f"left out of the metrics",
            f"pull: the real decisions (queue.sizing, worker.slicing) as js_pull.py and the "
            f"worker make them: a worker pulls while it holds < {self.high_water:g} "
            f"budgets (worker/loop.py: 2; 0: only when it holds nothing) or nothing, asking "
            f"for the room left (at least one budget's); "
            f"{full}"
            f"{self.rtt_ms:g} ms per "
            f"pull, overlapped with its batches; a pull that finds nothing long-polls "
            f"(waiting pulls served in turn); the interactive lane is asked for "
            f"pull_batch(room) messages (p90 of recent costs), the batch lane for the room "
            f"left; choose(room) keeps, NAK the rest to the head; a request over 2 budgets "
            f"is sliced (plan_slices) while fewer messages wait than slices, the first "
            f"slice kept, the others published to the tail of its lane for any worker",
            f"push: {self.rtt_ms:g} ms router-to-worker hop; whole requests, no slicing; "
            f"{self.routers} router(s), each seeing its own assignments at once and the rest "
            f"(other routers' assignments, all completions) {self.lag_ms:g} ms late; "
            f"least-outstanding counts requests (minimum over all workers, ties at random); "
            f"cost-aware counts predicted tokens over each worker's speed; the worker's "
            f"former is the same as pull's (interactive first, the cap)",
            f"p99 SLO {self.slo_ms or math.nan:g} ms over all requests, and completions >= "
            f"{self.min_goodput:.0%} of arrivals; load in fractions of nominal capacity (full "
            f"batches, no padding); highest load within the SLO by bisection "
            f"({self.search_steps} steps); saturation = offered {self.overload:g}x capacity",
        ]
