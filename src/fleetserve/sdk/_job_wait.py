"""How the SDK waits on a fine-tuning job: polls that back off while nothing happens,
and a typed error when the job ends without a model."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

from ..wire import DeadlineExceeded, FleetError
from .records import FineTuningEvent, FineTuningJob

OnEvent = Callable[[FineTuningEvent], object]
Page = tuple[list[FineTuningEvent], bool]  # one page of the feed, and whether more follow

MAX_POLL = 5.0  # seconds between two polls of a job whose feed is quiet, at most
GROWTH = 1.5  # each quiet poll waits this much longer than the one before


class FineTuningFailed(FleetError):
    """``fine_tune`` (or ``wait_fine_tuning_job(raise_on_failure=True)``): the job
    ended failed or cancelled. ``job`` is its record; ``status`` says which, and
    ``message`` the server's reason (``job["error"]``)."""

    code: ClassVar[str] = "fine_tuning_failed"

    def __init__(self, message: str, *, job: FineTuningJob) -> None:
        super().__init__(message, field="job")
        self.job = job
        self.status = job["status"]

    def fresh(self, *, retry_after: float | None = None) -> FineTuningFailed:
        return FineTuningFailed(self.message, job=self.job)


def succeeded(job: FineTuningJob) -> FineTuningJob:
    """``job`` if it succeeded; else raise ``FineTuningFailed`` with its reason."""
    if job["status"] == "succeeded":
        return job
    why = (job.get("error") or {}).get("message")
    reason = f": {why}" if why else ""
    raise FineTuningFailed(f"fine-tuning job {job['id']} {job['status']}{reason}", job=job)


class Backoff:
    """The wait before the next poll: ``poll`` after progress (a new event), growing by
    ``GROWTH`` up to ``MAX_POLL`` while the feed stays quiet."""

    def __init__(self, poll: float) -> None:
        self.poll = poll
        self.wait = poll

    def next(self, progressed: bool) -> float:
        self.wait = self.poll if progressed else min(self.wait * GROWTH, max(MAX_POLL, self.poll))
        return self.wait


def _seq(event: FineTuningEvent) -> int:
    return int(str(event["id"]).rsplit("-", 1)[-1])


class Follower:
    """A job's feed read newest first, page by page; each new event goes to
    ``on_event`` once, oldest first."""

    def __init__(self, on_event: OnEvent | None) -> None:
        self.on_event = on_event
        self.last = 0  # the newest event handed on
        self.newest: FineTuningEvent | None = None
        self._fresh: list[FineTuningEvent] = []
        self.progressed = False  # the last flush handed on a new event

    def take(self, page: Page) -> str | None:
        """Keep a page's new events; the ``after`` of the next page to read, or None."""
        rows, more = page
        new = [r for r in rows if _seq(r) > self.last]
        self._fresh.extend(new)
        return rows[-1]["id"] if more and rows and len(new) == len(rows) else None

    def flush(self) -> list[object]:
        """Hand on what the pages held; the callback's return values (awaitables)."""
        fresh, self._fresh = self._fresh, []
        self.progressed = bool(fresh)
        if fresh:
            self.last, self.newest = _seq(fresh[0]), fresh[0]
        return [self.on_event(e) for e in reversed(fresh)] if self.on_event else []

    def ended(self, job: FineTuningJob) -> bool:
        """The finished job's last status line has been seen (it follows the record)."""
        n = self.newest
        return (
            n is not None
            and n.get("type") == "status"
            and (int(n.get("created_at") or 0) >= int(job.get("finished_at") or 0))
        )


def deadline_of(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def until(deadline: float | None, wait: float) -> float:
    """``wait``, but not past ``deadline`` (the next poll then says it passed)."""
    return wait if deadline is None else max(0.0, min(wait, deadline - time.monotonic()))


def check(deadline: float | None, job_id: str, timeout: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlineExceeded(f"job {job_id} did not finish within {timeout:g} s")
