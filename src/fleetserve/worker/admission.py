"""What the generation runner queues and reports: waiting jobs and thread events.

Kept apart from the worker's batch former: generation admits whole requests (one
sequence each) into a running batch, by a budget of prompt + max_tokens tokens.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..runtimes import Generation
from .batcher import Job


@dataclass(slots=True)
class Event:
    """One thing the generation thread tells the event loop.

    ``kind``: ``start`` (admitted: its sequence runs), ``text`` (a chunk; ``text``
    None opens the stream), ``done`` (``output``
    is the Generation), ``expire``, ``crash`` (``error``), ``fail`` (a ``FleetError``
    answering this request only: its adapter was deleted), ``room`` (capacity freed) or
    ``fatal`` (the thread itself failed: the runner raises, which fails the worker).
    """

    kind: str
    job: Job | None = None
    text: str | None = None
    output: Generation | None = None
    error: BaseException | None = None


def cost(job: Job) -> int:
    """Tokens a job may hold in the cache: its prompt plus max_tokens."""
    return int(sum(job.prepared.lengths))


class WaitQueue:
    """Jobs waiting to start, oldest first; thread-safe.

    ``pending_tokens`` and ``max_batch_tokens`` pace the worker's pulls, as the batch
    former's do."""

    def __init__(self, max_batch_tokens: int) -> None:
        if max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be positive")
        self.max_batch_tokens = max_batch_tokens
        self.pending_tokens = 0
        self.interactive_tokens_pending = 0
        self._jobs: deque[Job] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._jobs)

    def resize(self, max_batch_tokens: int) -> None:
        """A new token budget (a profile swap) for the jobs admitted from now on."""
        if max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be positive")
        with self._lock:
            self.max_batch_tokens = max_batch_tokens

    def add(self, job: Job) -> None:
        """Interactive jobs go ahead of batch ones (each class in arrival order)."""
        with self._lock:
            if job.msg.envelope.interactive:
                at = next(
                    (i for i, j in enumerate(self._jobs) if not j.msg.envelope.interactive), None
                )
                self._jobs.insert(len(self._jobs) if at is None else at, job)
                self.interactive_tokens_pending += cost(job)
            else:
                self._jobs.append(job)
            self.pending_tokens += cost(job)

    def pop_if(self, fits: Callable[[Job], bool]) -> Job | None:
        """The first job (interactive first, then the oldest) if ``fits(it)``; jobs
        already settled are dropped."""
        with self._lock:
            while self._jobs and self._jobs[0].settled:
                self._forget(self._jobs.popleft())
            if not self._jobs or not fits(self._jobs[0]):
                return None
            job = self._jobs.popleft()
            self._forget(job)
            return job

    def _forget(self, job: Job) -> None:
        self.pending_tokens -= cost(job)
        if job.msg.envelope.interactive:
            self.interactive_tokens_pending -= cost(job)

    def drain(self) -> list[Job]:
        with self._lock:
            jobs = list(self._jobs)
            self._jobs.clear()
            self.pending_tokens = 0
            self.interactive_tokens_pending = 0
            return jobs
