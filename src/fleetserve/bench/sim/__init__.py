"""A discrete-event simulation of pull (one central queue) against push (a router).

Pure Python and ``heapq``, deterministic for a seed. Times are in milliseconds.

- Workload: Poisson arrivals; each request carries 1 to 256 items from a heavy-tailed
  mixture, each item 8 to 512 tokens (log-uniform), cut to the model's ``max_seq_len``.
  Every policy and every load replays the same requests (common random numbers): a
  higher load only compresses the arrival times.
- Workers run one batch at a time. A batch costs ``CostModel.predict_ms(tokens,
  max_len, batch_size) / speed``, with coefficients from a catalog profile. The batch
  budget (padded tokens) and the batch size cap scale with the speed by default, and
  batches are formed as the worker's batch former does: a window of the oldest items,
  sorted by length, packed while ``max_len * n`` fits the budget. Large requests span
  batches; a request completes when its last item does.
- ``pull``: one FIFO queue. A worker that needs work pays a broker round trip, pulls
  whole requests oldest first until its window is full, forms a batch and puts the
  requests it did not touch back at the head (counted as put-backs).
- ``push-*``: a router sends each request to one worker's FIFO, one hop later.
  ``push-rr`` is round robin; ``push-lor`` picks the least outstanding requests as the
  router sees them; ``push-loc`` (a stronger baseline that knows each worker's speed
  and each request's cost) picks the earliest expected finish. There are ``routers``
  routers (gateways, taking arrivals in turn). Each sees its own assignments at once
  and everything else (other routers' assignments, all completions) ``lag_ms`` late.
- A load meets the SLO when p99 is within it and the fleet keeps up (completions in
  the measured window reach ``min_goodput`` of arrivals): a short run can hide an
  overload whose queue has not yet grown past the SLO.
"""

from .engine import Run
from .params import DEFAULT_MIX, DEFAULT_MODEL, HOMOGENEOUS, MIXED_FLEET, POLICIES, Params
from .policies import simulate
from .search import (
    Point,
    at_load,
    default_slo_ms,
    isolated_latency,
    max_load_at_slo,
    point,
    sweep,
)
from .workload import Workload, capacity_rps, fleet_speeds, make_workload

__all__ = [
    "DEFAULT_MIX",
    "DEFAULT_MODEL",
    "HOMOGENEOUS",
    "MIXED_FLEET",
    "POLICIES",
    "Params",
    "Point",
    "Run",
    "Workload",
    "at_load",
    "capacity_rps",
    "default_slo_ms",
    "fleet_speeds",
    "isolated_latency",
    "make_workload",
    "max_load_at_slo",
    "point",
    "simulate",
    "sweep",
]
