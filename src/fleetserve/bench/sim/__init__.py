"""A discrete-event simulation of pull (one central queue) against push (routers).

Pure Python and ``heapq``, deterministic for a seed. Times are in milliseconds.

- Workload: Poisson arrivals; each request carries 1 to 256 items from a heavy-tailed
  mixture, each item 8 to 512 tokens (log-uniform), cut to the model's ``max_seq_len``.
  Every policy and every load replays the same requests (common random numbers): a
  higher load only compresses the arrival times. A request is interactive when its
  predicted cost (its tokens) is at most the profile's ``interactive_cost``.
- Cost models (``costs``): ``cpu`` from a profile ``fleetserve tune`` fitted, ``gpu``
  from a tuned ``cuda-*`` profile or, failing one, the spec's ``cuda`` budgets, which
  are assumed; every report says which.
- Workers run one batch at a time, costing ``CostModel.predict_ms(tokens, max_len,
  batch_size) / speed``. Their batch former (``former``) is the same under every
  policy and follows ``worker/batcher.py``: queries only while any wait (bulk work
  gets a batch once it has had none for ``age_limit_ms``), the interactive cap while
  queries are about, a window of the next items sorted by length, packed while
  ``max_len * n`` fits the budget.
- ``pull``: the real worker's decisions (``puller``: ``queue.sizing.pull_batch``,
  ``choose``, ``worker.slicing.plan_slices``) on a simulated queue with a lane per
  class. A worker pulls for the room below ``high_water`` budgets and,
  when full, for queries only (``worker/loop.py``); put-backs go to the head of their
  lane, slices of large requests to the tail, for any worker.
- ``push-*``: a router sends each whole request to one worker, one hop later.
  ``push-rr`` is round robin; ``push-lor`` picks the least outstanding requests as the
  router sees them; ``push-loc`` picks the least predicted tokens over the worker's
  speed. Each of ``routers`` routers sees its own assignments at once and everything
  else (other routers' assignments, all completions) ``lag_ms`` late.
- A load meets the SLO when p99 (over all requests) is within it and the fleet keeps
  up (completions in the measured window reach ``min_goodput`` of arrivals).
"""

from .costs import COST_MODELS, CostSource, find_cost, from_catalog
from .engine import Run
from .params import DEFAULT_MIX, DEFAULT_MODEL, HOMOGENEOUS, LAGS, MIXED_FLEET, POLICIES, Params
from .policies import simulate
from .search import (
    Point,
    at_load,
    default_slo_ms,
    isolated_latency,
    max_load_at_slo,
    plan,
    point,
    sweep,
    workload_for,
)
from .synthetic import Workload, capacity_rps, fleet_speeds, make_workload

__all__ = [
    "COST_MODELS",
    "DEFAULT_MIX",
    "DEFAULT_MODEL",
    "HOMOGENEOUS",
    "LAGS",
    "MIXED_FLEET",
    "POLICIES",
    "CostSource",
    "Params",
    "Point",
    "Run",
    "Workload",
    "at_load",
    "capacity_rps",
    "default_slo_ms",
    "find_cost",
    "fleet_speeds",
    "from_catalog",
    "isolated_latency",
    "make_workload",
    "max_load_at_slo",
    "plan",
    "point",
    "simulate",
    "sweep",
    "workload_for",
]
