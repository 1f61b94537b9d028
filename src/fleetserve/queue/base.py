"""The queue's two roles: the seam between gateways and pulling workers.

A :class:`Publisher` is the gateway's side, a :class:`Consumer` the worker's; a
:class:`WorkQueue` plays both (the in-process queues, and a worker that publishes
the slices of a large request back to the queue it pulls from).

Gateways ``publish`` an envelope and a raw body and get a :class:`PendingReply`.
Workers ``pull`` messages for the models they serve, within a cost budget, then
``reply`` and only after that ``ack``. A worker that pulled more than it can batch
``nak``-s the surplus so that it goes back to the queue at once.

Work that must never run again is ``term``-ed (its deadline passed) or
``dead_letter``-ed (it failed ``max_deliver`` times, or its headers do not parse):
the dead-letter store keeps the message with the reason.

``depth`` is synchronous and, for a distributed queue, eventually consistent:
``refresh`` brings it up to date for the given models.

A gateway whose client hung up (or whose deadline passed) calls ``cancel``; workers
hear of it through ``on_cancel`` and stop that work wherever it is (``cancels.py``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..wire import Envelope, Reply
from .cancels import CancelListener


@dataclass(slots=True)
class Message:
    """One delivery of a published request."""

    envelope: Envelope
    body: bytes
    delivery_id: int
    attempts: int = 1
    reply_to: str = ""  # where the publisher waits; empty for the in-process queue
    payload: str | None = None  # a payload-store key when the body was offloaded


@dataclass(slots=True)
class QueueStats:
    """Counters one queue instance keeps, per model; the worker exports them."""

    put_backs: dict[str, int] = field(default_factory=dict)
    redeliveries: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)

    def bump(self, counter: dict[str, int], model: str, n: int = 1) -> None:
        counter[model] = counter.get(model, 0) + n


@runtime_checkable
class PendingReply(Protocol):
    """The gateway's handle on a published request."""

    async def wait(self, timeout: float) -> Reply:
        """The worker's reply; raises ``DeadlineExceeded`` after ``timeout`` seconds."""
        ...

    def stream(self, timeout: float) -> AsyncGenerator[Reply, None]:
        """A streamed reply: its chunks (``final=False``) in order, then the final reply."""
        ...

    def cancel(self) -> None:
        """Stop waiting; a reply that still arrives is dropped."""
        ...


@runtime_checkable
class Publisher(Protocol):
    """The gateway's side: publish, await the reply (or its stream), cancel."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(
        self, envelope: Envelope, body: bytes, payload: str | None = None
    ) -> PendingReply:
        """Enqueue; raises ``Overloaded`` when the model's bounded queue is full.

        ``payload`` is a payload-store key that stands in for an offloaded body.
        """
        ...

    async def cancel(self, request_id: str, until: float) -> None:
        """The client of ``request_id`` is gone, or its deadline passed: its work (and
        its slices') stops wherever it is, waiting here or in any worker. ``until`` is
        its deadline, after which none of it would run anyway."""
        ...

    @property
    def healthy(self) -> bool: ...


@runtime_checkable
class Consumer(Protocol):
    """The worker's side: pull, reply, then ack; nak (give back), touch, term,
    dead-letter; hear of cancels; read the depth."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def stats(self) -> QueueStats: ...

    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        """Up to ``budget`` total cost (at least one message) within ``timeout`` seconds,
        interactive work first (``interactive_only``: nothing else).

        Returns an empty list when nothing arrived in time.
        """
        ...

    async def ack(self, msg: Message) -> None:
        """The message is done; it will not be delivered again."""
        ...

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        """Put the message back at the head of its queue, for any worker, after ``delay``."""
        ...

    async def touch(self, msg: Message) -> None:
        """Still working on it: push back the time after which it is redelivered."""
        ...

    async def term(self, msg: Message) -> None:
        """Drop it for good without a result (for example, its deadline passed)."""
        ...

    async def dead_letter(self, msg: Message, reason: str) -> None:
        """Keep it, with ``reason``, in the dead-letter store; it is not delivered again."""
        ...

    async def reply(self, msg: Message, reply: Reply) -> None:
        """Send the reply to the gateway that published ``msg``."""
        ...

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        """Call ``listener`` for each cancel this queue hears of; returns the call that
        removes it."""
        ...

    def depth(self, model: str) -> int:
        """Messages waiting (not in flight) for ``model``, as of the last ``refresh``."""
        ...

    async def refresh(self, models: Sequence[str]) -> None:
        """Bring ``depth`` up to date for ``models``."""
        ...

    @property
    def healthy(self) -> bool: ...


@runtime_checkable
class WorkQueue(Publisher, Consumer, Protocol):
    """Both roles in one: the in-process queues, and what a worker that publishes
    slices (``worker.parts``) or a device parent's local queue pulls from."""
