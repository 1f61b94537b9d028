"""The fleet-memory scenario: many models, a memory budget per worker, cold loads and
eviction (``fleet/policy.py``), with and without model affinity in the pull.

Pure Python and ``heapq``, deterministic for a seed. Times are in seconds, sizes in bytes
(binary units: 1 MiB = 2**20).

- Models: ``models`` of them, Zipf popularity (rank ``k`` drawn with weight
  ``1 / k**zipf_s``). Sizes come from a few classes, 50 MiB to 1.5 GiB, in the classes'
  proportions and shuffled by the seed: independent of popularity. A reload takes
  ``load_fixed_s + size / load_mib_s`` times a log-normal factor; a share of the
  models are slow conversions (GGUF-like, an export on load) that take several times
  longer. A request of a model costs the model's service time (a fixed part plus a
  part per GiB, log-normal), batches cost the sum of theirs.
- Requests: one Poisson stream, a model per request by popularity; the rate is scaled
  with the workers so that compute is busy ``utilization`` of the time. Every
  configuration with the same number of workers replays the same requests.
- Workers: one batch at a time (up to ``batch`` requests of one model, pulled from that
  model's subject oldest first), and a loader thread beside it: a load takes the
  model's reload time, the worker keeps serving its resident models meanwhile, and the
  requests pulled for the loading model wait for it. One load at a time per worker.
  Memory = resident models + the one loading, never above the budget: before a load
  the worker evicts ``victims(...)`` by its own policy (GDSF or LRU); a model with a
  batch in flight or requests waiting on this worker is busy and never evicted (with
  ``admitted_busy``, one with requests waiting in the queue too: an embedded server
  admits each request as it arrives; and, as that server does, a load whose policy
  would rather evict a busy model waits for it, running its batches, at most the
  reload seconds that saves). A worker pulls cold work only when its loader is free
  and the model can be made to fit.
- Affinity on: a worker pulls first for the models it holds (the one whose oldest
  message is oldest); it takes a cold model only when it has nothing resident to do or
  that model's oldest message has waited ``affinity_wait_s``, and never a model another
  worker holds (or is loading) with room to spare: one that is idle, or while that
  model's backlog is below one batch.
- Affinity off: a worker takes the oldest message it can act on now, whatever its model,
  and loads its model if it is not resident.
- A request misses when its model was not resident on the worker that pulled it.
  Latency = queue wait + load wait + the batch it is served in. The first ``warmup`` of
  the requests (by arrival) are left out of every metric; loads and evictions count
  when they start inside the measured window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from .fleet_engine import FleetSim as FleetSim
from .fleet_engine import simulate_fleet as simulate_fleet
from .fleet_model import EVICTIONS as EVICTIONS
from .fleet_model import GIB as GIB
from .fleet_model import MIB as MIB
from .fleet_model import SIZE_CLASSES as SIZE_CLASSES
from .fleet_model import FleetParams as FleetParams
from .fleet_model import FleetRun as FleetRun
from .fleet_model import FleetWorkload as FleetWorkload
from .fleet_model import Model as Model
from .fleet_model import fmt_bytes as fmt_bytes
from .fleet_model import make_fleet_workload as make_fleet_workload
from .fleet_model import make_models as make_models
from .fleet_model import parse_bytes as parse_bytes


@dataclass
class Config:
    workers: int
    affinity: bool
    eviction: str

    @property
    def label(self) -> str:
        return f"{self.workers}w affinity {'on' if self.affinity else 'off'} {self.eviction}"


@dataclass
class Comparison:
    params: FleetParams
    seed: int
    runs: list[FleetRun] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "params": asdict(self.params),
            "seed": self.seed,
            "runs": [asdict(r) for r in self.runs],
        }


def _config_task(args: tuple[Config, FleetParams, int]) -> FleetRun:
    c, p, seed = args
    wl = make_fleet_workload(p, c.workers, seed)
    return simulate_fleet(wl, c.workers, p, affinity=c.affinity, eviction=c.eviction)


def configs(
    workers: Sequence[int], affinity: Sequence[bool], evictions: Sequence[str]
) -> list[Config]:
    return [Config(w, a, e) for w in workers for a in affinity for e in evictions]


def compare(
    cfgs: Sequence[Config],
    p: FleetParams,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[FleetRun], None] | None = None,
) -> Comparison:
    """Every configuration, in ``jobs`` processes when more than one; the same requests
    for every configuration with the same number of workers."""
    tasks = [(c, p, seed) for c in cfgs]
    out = Comparison(p, seed)
    if jobs <= 1:
        for task in tasks:
            out.runs.append(_config_task(task))
            if progress:
                progress(out.runs[-1])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    # the largest fleets first, so that the two processes finish together
    order = sorted(range(len(tasks)), key=lambda k: -tasks[k][0].workers)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        runs = dict(zip(order, pool.map(_config_task, [tasks[k] for k in order]), strict=True))
    for k in range(len(tasks)):
        out.runs.append(runs[k])
        if progress:
            progress(runs[k])
    return out


__all__ = [
    "EVICTIONS",
    "SIZE_CLASSES",
    "Comparison",
    "Config",
    "FleetParams",
    "FleetRun",
    "FleetSim",
    "FleetWorkload",
    "Model",
    "compare",
    "configs",
    "make_fleet_workload",
    "make_models",
    "parse_bytes",
    "simulate_fleet",
]
