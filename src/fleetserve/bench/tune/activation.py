"""The activation peak of one full batch: the memory a batch at the full budget takes
above the loaded weights, measured once per load on the family's own mixed workload.

It runs a family's forward on items from `tune.workload`, pooled as `tune.costfit` pools
them, so it lives here, above the worker, and not in `fleet/memory.py` beside the
resident-set readings it uses.

A generation model's batch is its engine's largest prefill: as many prompts of the
engine's chunk as the token budget and the batch size allow (a longer prompt is
prefilled a chunk a step, alone), through to their first token. One such prompt is
measured and the figure scaled by their count: a prefill's activations grow with its
rows (SmolLM2-135M at fp32 on a 2-core AMD EPYC: 128 MiB for 4 prompts of 512 tokens,
262 MiB for 8), and one prompt costs a quarter of the time of four (4 s there, not
15). The KV cache those tokens leave is not counted here: the fleet charges it apart,
at the whole token budget (``kv_cache_bytes``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
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
    CPU, allocator peak on CUDA. A generation model: its largest prefill, less the KV
    cache it leaves. 0 on an external runtime, and whenever it cannot be measured: a
    failed measurement never fails a load."""
    try:
        if "external" in (spec.runtime, adapter.runtime.name):
            return 0
        if spec.family == "generate":
            return _prefill(adapter, spec, max_batch_tokens, max_batch_size)
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
    return _peak_of(adapter.runtime.device, lambda: adapter.forward(batch))


def _prefill(adapter: AnyFamily, spec: ModelSpec, max_batch_tokens: int, size: int) -> int:
    from ...families.generate.chat import GenItem
    from ...families.generate.engine import PREFILL_CHUNK
    from ...families.generate.family import GenerateFamily
    from ...runtimes import SamplingParams

    if not isinstance(adapter, GenerateFamily) or adapter.model is None:
        return 0
    # prompts of one chunk each, and the one token each chooses, within the budget
    width = min(adapter.prefill_chunk or PREFILL_CHUNK, max_batch_tokens - 1)
    if spec.max_seq_len:
        width = min(width, spec.max_seq_len - 1)
    width = max(1, width)
    count = max(1, min(size, max_batch_tokens // (width + 1)))
    vocab = max(1, adapter.vocab_size)
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    one = [GenItem([(31 * j) % vocab for j in range(width)], greedy)]
    peak = _peak_of(adapter.runtime.device, lambda: adapter.forward(one))
    return count * max(0, peak - adapter.kv_cache_bytes(width))


def _peak_of(device: str, run: Callable[[], object]) -> int:
    """What ``run`` took above what was held before it, at its peak."""
    if device.startswith("cuda"):
        import torch

        dev = torch.device(device)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        run()
        torch.cuda.synchronize(dev)
        return max(0, int(torch.cuda.max_memory_allocated(dev)) - before)
    trim()  # heap held free would hide the batch's own growth
    reset_peak()
    before = rss_bytes()
    run()
    return max(0, peak_bytes() - before)
