"""The batch former: packs items from many requests into batches by predicted cost.

Items are taken oldest first into a window, sorted by length inside it (to cut
padding), then packed while the padded size (max length x batch size) fits the
profile's token budget. One request's items may be spread across several batches.

Interactive items go first: while any wait, the next batch holds only them. Batches
are capped at ``interactive_tokens`` (the profile's ``priority_cap``) while interactive
work waits and for ``hold`` seconds after the last interactive request, so that the
next query does not wait behind a full batch. If interactive work has kept batch work
from any batch for ``age_limit`` seconds, batch work takes the next one, so that it
never starves (and a query waits for at most one such batch).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..families import Prepared
from ..queue import Message
from .records import Record, State


@dataclass(eq=False, slots=True)
class Job:
    """One request in the worker: its message, prepared items and collected outputs."""

    msg: Message
    prepared: Prepared[Any, Any]
    pulled_at: float
    remaining: int = 0
    # the item ranges served here (None: all); the rest are parts other workers serve
    spans: list[tuple[int, int]] | None = None
    outputs: list[Any] | None = None
    infer_s: float = 0.0
    reason: str = ""  # why it failed, for the dead-letter stream (not for the client)
    # where it stands; only the worker's ledger moves it (``worker.ledger``)
    record: Record = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.remaining = len(self.prepared.items)
        self.record = Record(self.msg, State.BATCHED)

    @property
    def settled(self) -> bool:
        """Answered, failed, cancelled or given back: whatever is left of it is dropped."""
        return self.record.settled

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
    interactive: bool = False


class BatchFormer:
    """``max_adapters``: distinct LoRA adapters one batch may mix (the base is free).
    ``interactive_tokens``: the batch budget while interactive work is about (0: the
    full budget); ``hold`` and ``age_limit`` in seconds (see the module's docstring)."""

    def __init__(
        self,
        max_batch_tokens: int,
        max_batch_size: int,
        max_adapters: int = 16,
        *,
        interactive_tokens: int = 0,
        hold: float = 5.0,
        age_limit: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batch_tokens < 1 or max_batch_size < 1 or max_adapters < 1:
            raise ValueError("batch budgets must be positive")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_adapters = max_adapters
        self.interactive_tokens = min(interactive_tokens or max_batch_tokens, max_batch_tokens)
        self.hold = hold
        self.age_limit = age_limit
        self._items: deque[WorkItem] = deque()
        self._interactive = 0  # interactive items waiting
        self.interactive_tokens_pending = 0  # their tokens
        self._last_interactive = -1e18  # monotonic time an interactive job last came
        self._clock = clock
        self._batch_turn = clock()  # when batch work last had a batch (or none waited)
        self.pending_tokens = 0

    def __len__(self) -> int:
        return len(self._items)

    def resize(
        self, max_batch_tokens: int, max_batch_size: int, *, interactive_tokens: int = 0
    ) -> None:
        """New budgets (a profile swap), from the next batch on: what waits stays queued,
        in its order. An item longer than the new budget still runs, alone."""
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError("batch budgets must be positive")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.interactive_tokens = min(interactive_tokens or max_batch_tokens, max_batch_tokens)

    @property
    def interactive_waiting(self) -> bool:
        return self._interactive > 0

    def add(self, job: Job) -> None:
        p = job.prepared
        env = job.msg.envelope
        if env.interactive:
            self._last_interactive = self._clock()
        for start, stop in job.spans or [(0, len(p.items))]:
            for i in range(start, stop):
                length = p.lengths[i]
                it = WorkItem(job, i, p.items[i], length, env.adapter, env.interactive)
                self._items.append(it)
                self.pending_tokens += length
                self._interactive += env.interactive
                self.interactive_tokens_pending += length if env.interactive else 0

    def budget(self) -> int:
        """The token budget of the next batch: capped while interactive work is about."""
        about = self._interactive > 0 or self._clock() - self._last_interactive < self.hold
        return self.interactive_tokens if about else self.max_batch_tokens

    def take(self) -> list[WorkItem]:
        """The next batch (empty when nothing is pending). Items of failed jobs are dropped."""
        while self._items and self._items[0].job.settled:
            self._drop(self._items.popleft())
        if not self._items:
            return []
        budget = self.budget()
        now = self._clock()
        batch_waits = len(self._items) > self._interactive
        only: bool | None = None  # which class this batch takes (None: any)
        if self._interactive > 0:
            starved = batch_waits and now - self._batch_turn > self.age_limit
            only = not starved  # a batch of batch work once per age_limit at least
        head = self._items[0].job
        if head.msg.attempts > 1 and only in (None, head.msg.envelope.interactive):
            if not head.msg.envelope.interactive:
                self._batch_turn = now
            return self._alone(head, budget)
        window = self._window(only, budget)
        if not window and only:  # the interactive items all failed since they came
            self._purge()
            window = self._window(None, budget)
        if not batch_waits or not only:
            self._batch_turn = now  # batch work has this batch (or none waits)
        window.sort(key=lambda it: it.length)
        batch: list[WorkItem] = []
        adapters: set[str] = set()
        for it in window:
            if it.adapter is not None and it.adapter not in adapters:
                if len(adapters) >= self.max_adapters:
                    continue  # it waits for a batch with room for another adapter
                adapters.add(it.adapter)
            n = len(batch) + 1
            if batch and (it.length * n > budget or n > self.max_batch_size):
                break
            batch.append(it)
        return self._remove(batch)

    def _purge(self) -> None:
        """Drop the items of failed jobs (anywhere, not only at the head)."""
        for it in self._items:
            if it.job.settled:
                self._drop(it)
        self._items = deque(it for it in self._items if not it.job.settled)

    def _window(self, only: bool | None, budget: int) -> list[WorkItem]:
        """Items to choose the batch from, oldest first: of one class (``only``: whether
        interactive) or any; about two batches' worth."""
        window: list[WorkItem] = []
        tokens = 0
        for it in self._items:
            if it.job.settled or (only is not None and it.interactive != only):
                continue
            window.append(it)
            tokens += it.length
            if tokens >= 2 * budget or len(window) >= 2 * self.max_batch_size:
                break
        return window

    def _alone(self, job: Job, budget: int) -> list[WorkItem]:
        """A retried request (its batch failed before) runs without others: if it is the
        poison, it fails alone, and innocent requests are not retried with it. (Behind
        interactive work it waits like any batch work.)"""
        batch: list[WorkItem] = []
        for it in self._items:
            if it.job is not job:
                continue
            n = len(batch) + 1
            width = max([it.length, *(b.length for b in batch)])
            if batch and (width * n > budget or n > self.max_batch_size):
                break
            batch.append(it)
        return self._remove(batch)

    def _remove(self, batch: list[WorkItem]) -> list[WorkItem]:
        chosen = {id(it) for it in batch}
        self._items = deque(it for it in self._items if id(it) not in chosen)
        for it in batch:
            self._drop(it)
        return batch

    def _drop(self, it: WorkItem) -> None:
        self.pending_tokens -= it.length
        self._interactive -= it.interactive
        self.interactive_tokens_pending -= it.length if it.interactive else 0

    def drain(self) -> list[WorkItem]:
        items = list(self._items)
        self._items.clear()
        self.pending_tokens = 0
        self._interactive = 0
        self.interactive_tokens_pending = 0
        return items
