"""Drive an adapter as the worker does, without a server."""

from __future__ import annotations

from typing import Any

from fleetserve.families import AnyFamily, Prepared
from fleetserve.wire import Envelope


def run_like_worker(a: AnyFamily, env: Envelope, raw: bytes) -> tuple[bytes, Prepared]:
    """Preprocess, then forward the items in two batches in reverse order (so rows are
    padded with others and routed back by index), then postprocess."""
    prepared = a.preprocess(env, raw)
    n = len(prepared.items)
    order = list(reversed(range(n)))
    outs: dict[int, Any] = {}
    for part in (order[: n // 2], order[n // 2 :]):
        if part:
            for i, row in zip(part, a.forward([prepared.items[i] for i in part]), strict=True):
                outs[i] = row
    return a.postprocess(env, prepared, [outs[i] for i in range(n)]), prepared
