"""The activation peak of one full batch: the memory a batch at the full budget takes
above the loaded weights, measured once per load on the family's own mixed workload.

It runs a family's forward on items from `tune.workload`, pooled as `tune.costfit` pools
them, so it lives here, above the worker, and not in `fleet/memory.py` beside the
resident-set readings it uses.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from ...catalog import ModelSpec
from ...families import AnyFamily
from ...fleet.memory import peak_bytes, reset_peak, rss_bytes, trim
from .costfit import item_pool
from .workload import requests

log = logging.getLogger(__name__)


def measure_activation_peak(
    adapter: AnyFamily,
    spec: ModelSpec,
    path: Path,
    max_batch_tokens: int,
    max_batch_size: int,
) -> int:
    """The memory one batch at the full budget takes above the loaded weights: the
    longest prepared items of the family's mixed workload, as many as fit
    ``max_batch_tokens`` (longest times count) and ``max_batch_size``. Resident-set peak on
    CPU, allocator peak on CUDA. 0 for generation and external runtimes, and whenever
    it cannot be measured: a failed measurement never fails a load."""
    try:
        if spec.family == "generate" or "external" in (spec.runtime, adapter.runtime.name):
            return 0
        return _measure(adapter, spec, path, max_batch_tokens, max_batch_size)
    except Exception as exc:  # measuring is best effort
        log.debug("activation peak of %s not measured: %s", spec.id, exc, exc_info=True)
        return 0


def _measure(
    adapter: AnyFamily,
    spec: ModelSpec,
    path: Path,
    max_batch_tokens: int,
    max_batch_size: int,
) -> int:
    size = max(1, max_batch_size)
    per_request = 32
    n = max(2, math.ceil(2 * size / (per_request - 1)))
    pool = item_pool(adapter, spec.id, requests(spec, path, "mix", per_request, n))
    if not pool:
        return 0
    ranked = sorted(pool, key=lambda x: x[1], reverse=True)
    width = max(1, ranked[0][1])
    count = max(1, min(size, max_batch_tokens // width))
    batch: list[Any] = [ranked[i % len(ranked)][0] for i in range(count)]
    device = adapter.runtime.device
    if device.startswith("cuda"):
        import torch

        dev = torch.device(device)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        adapter.forward(batch)
        torch.cuda.synchronize(dev)
        return max(0, int(torch.cuda.max_memory_allocated(dev)) - before)
    trim()  # heap held free would hide the batch's own growth
    reset_peak()
    before = rss_bytes()
    adapter.forward(batch)
    return max(0, peak_bytes() - before)
