"""Envelopes for queue tests."""

from __future__ import annotations

import itertools
import time

from fleetserve.wire import Encoding, Envelope, Priority, Task

_ids = itertools.count()


def env(
    model: str = "m/a",
    cost: int = 1,
    rid: str | None = None,
    *,
    deadline_in: float = 30.0,
    encoding: Encoding = Encoding.JSON,
    priority: Priority = Priority.BATCH,
    waited: float = 0.0,
) -> Envelope:
    now = time.time()
    return Envelope(
        request_id=rid or f"req-{next(_ids)}",
        model=model,
        task=Task.ENCODE,
        content_type=encoding,
        accept=encoding,
        cost_hint=cost,
        deadline=now + deadline_in,
        enqueued_at=now - waited,
        priority=priority,
    )
