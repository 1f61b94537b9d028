"""The batch former: packs items from many requests into batches by predicted cost.

Items are taken oldest first into a window, sorted by length inside it (to cut
padding), then packed while the padded size (max length x batch size) fits the
profile's token budget. One request's items may be spread across several batches.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..families import Prepared
from ..queue import Message


@dataclass(eq=False, slots=True)
class Job:
    """One request in the worker: its message, prepared items and collected outputs."""

    msg: Message
    prepared: Prepared[Any, Any]
    pulled_at: float
    remaining: int = 0
    outputs: list[Any] | None = None
    infer_s: float = 0.0
    failed: bool = False
    reason: str = ""  # why it failed, for the dead-letter stream (not for the client)

    def __post_init__(self) -> None:
        self.remaining = len(self.prepared.items)

    @property
    def expired(self) -> bool:
        return time.time() > self.msg.envelope.deadline


@dataclass(eq=False, slots=True)
class WorkItem:
    job: Job
    index: int
    item: Any = field(repr=False)  # what the adapter's forward takes for this row
    length: int = 0  # its cost in tokens
    adapter: str | None = None  # the LoRA adapter this row runs (None: the base model)


class BatchFormer:
    """``max_adapters``: distinct LoRA adapters one batch may mix (the base is free)."""

    def __init__(self, max_batch_tokens: int, max_batch_size: int, max_adapters: int = 16) -> None:
        if max_batch_tokens < 1 or max_batch_size < 1 or max_adapters < 1:
            raise ValueError("batch budgets must be positive")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_adapters = max_adapters
        self._items: deque[WorkItem] = deque()
        self.pending_tokens = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, job: Job) -> None:
        p = job.prepared
        adapter = job.msg.envelope.adapter
        for i, (item, length) in enumerate(zip(p.items, p.lengths, strict=True)):
            self._items.append(WorkItem(job, i, item, length, adapter))
            self.pending_tokens += length

    def take(self) -> list[WorkItem]:
        """The next batch (empty when nothing is pending). Items of failed jobs are dropped."""
        while self._items and self._items[0].job.failed:
            self._drop(self._items.popleft())
        if not self._items:
            return []
        head = self._items[0].job
        if head.msg.attempts > 1:
            return self._alone(head)
        window: list[WorkItem] = []
        window_tokens = 0
        for it in self._items:
            if it.job.failed:
                continue
            window.append(it)
            window_tokens += it.length
            if window_tokens >= 2 * self.max_batch_tokens or len(window) >= 2 * self.max_batch_size:
                break
        window.sort(key=lambda it: it.length)
        batch: list[WorkItem] = []
        adapters: set[str] = set()
        for it in window:
            if it.adapter is not None and it.adapter not in adapters:
                if len(adapters) >= self.max_adapters:
                    continue  # it waits for a batch with room for another adapter
                adapters.add(it.adapter)
            n = len(batch) + 1
            if batch and (it.length * n > self.max_batch_tokens or n > self.max_batch_size):
                break
            batch.append(it)
        return self._remove(batch)

    def _alone(self, job: Job) -> list[WorkItem]:
        """A retried request (its batch failed before) runs without others: if it is the
        poison, it fails alone, and innocent requests are not retried with it."""
        batch: list[WorkItem] = []
        for it in self._items:
            if it.job is not job:
                continue
            n = len(batch) + 1
            width = max([it.length, *(b.length for b in batch)])
            if batch and (width * n > self.max_batch_tokens or n > self.max_batch_size):
                break
            batch.append(it)
        return self._remove(batch)

    def _remove(self, batch: list[WorkItem]) -> list[WorkItem]:
        chosen = {id(it) for it in batch}
        self._items = deque(it for it in self._items if id(it) not in chosen)
        for it in batch:
            self.pending_tokens -= it.length
        return batch

    def _drop(self, it: WorkItem) -> None:
        self.pending_tokens -= it.length

    def drain(self) -> list[WorkItem]:
        items = list(self._items)
        self._items.clear()
        self.pending_tokens = 0
        return items
