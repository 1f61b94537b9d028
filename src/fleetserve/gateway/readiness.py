"""When a gateway of the distributed mode is ready: connected to the queue, and a
worker there to take the work, with the pinned models loaded. Before, ``/readyz``
said 200 as soon as NATS answered, before any worker was, and the first requests
waited in the queue for a worker to start."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..catalog import Catalog
from ..wire import Unavailable
from ..wire.heartbeat import Heartbeat


def not_ready(connected: bool, catalog: Catalog, workers: Iterable[Heartbeat]) -> str:
    """Why this gateway is not ready ("" when it is): not connected; no live worker
    ready; or a pinned model that live workers serve but none of them has ready yet
    (a worker is ready once the models it loads at start have loaded or failed)."""
    if not connected:
        return "not connected to the queue"
    beats = list(workers)
    if not any(b.ready for b in beats):
        starting = f" ({len(beats)} starting)" if beats else ""
        return f"no worker is ready yet{starting}"
    waiting = [
        spec.id
        for spec in catalog
        if spec.pinned
        and any(spec.id in b.models for b in beats)
        and not any(b.ready and spec.id in b.models for b in beats)
    ]
    if waiting:
        return "pinned models still loading: " + ", ".join(waiting)
    return ""


def not_ready_error(
    why: Callable[[], str] | None, ready_in: Callable[[], float | None] | None, retry: float
) -> Unavailable:
    """The 503 a request gets before the process is ready: what is happening, and a
    Retry-After of the estimate where there is one (a quick tune's budget left)."""
    said = (why() if why is not None else "") or "models are loading or the worker failed"
    eta = ready_in() if ready_in is not None else None
    return Unavailable(f"not ready: {said}", retry_after=max(retry, eta or 0.0))
