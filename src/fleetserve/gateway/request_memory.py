"""The memory requests in flight hold, reserved against a budget of its own
(``request_memory``) before a body is read or decoded.

A request reserves its body's bytes times :data:`FACTOR` (the body, its copy in the
queue and what decoding and tokenizing its items build), from its Content-Length
before the body arrives, and grown with each chunk as it arrives (a body without one is
refused within the chunk that overflows the budget); it gives it back once its reply
(a stream's last chunk too) is sent. The models' budget (``--memory-budget``) does not
count requests, so the process stays within that budget plus this one. A full budget
is a 503 with Retry-After (others' requests will finish); a request that alone exceeds
it a 413.
"""

from __future__ import annotations

from ..fleet.memory import parse_limit
from ..settings import Settings
from ..wire import PayloadTooLarge, Unavailable

FACTOR = 7  # bytes held per body byte in flight: measured 6.4 (2048 texts, a 15 MB body)


class RequestMemory:
    """Reservations against ``budget`` bytes (0: no budget, nothing is refused)."""

    def __init__(self, budget: int, *, retry_after: float = 1.0, factor: int = FACTOR) -> None:
        self.budget = budget
        self.factor = factor
        self.retry_after = retry_after
        self.held = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestMemory:
        forms = "bytes or a size such as 256MiB, or 0"
        budget = parse_limit(settings.request_memory, "--request-memory", limit=0, forms=forms)
        return cls(budget, retry_after=settings.retry_after)

    def reservation(self) -> Reservation:
        """An empty reservation: :meth:`Reservation.grow` takes, ``release`` gives back."""
        return Reservation(self)

    def _take(self, body_bytes: int, extra: int, held: int) -> None:
        if self.budget and extra:
            if held + extra > self.budget:
                raise PayloadTooLarge(
                    f"a body of {body_bytes} bytes needs {held + extra} bytes of request "
                    f"memory, more than this server's budget of {self.budget} (request_memory)",
                    field="body",
                )
            if self.held + extra > self.budget:
                raise Unavailable(
                    f"request memory is full ({self.held} of {self.budget} bytes held by "
                    "requests in flight; request_memory): retry shortly",
                    retry_after=self.retry_after,
                )
        self.held += extra


class Reservation:
    """What one request holds of a :class:`RequestMemory`."""

    def __init__(self, memory: RequestMemory) -> None:
        self.memory = memory
        self.bytes = 0

    def grow(self, body_bytes: int) -> None:
        """Hold enough for a body of ``body_bytes`` (413 or 503 when it cannot)."""
        extra = max(0, body_bytes * self.memory.factor - self.bytes)
        self.memory._take(body_bytes, extra, self.bytes)
        self.bytes += extra

    def release(self) -> None:
        self.memory.held -= self.bytes
        self.bytes = 0


__all__ = ["FACTOR", "RequestMemory", "Reservation"]
