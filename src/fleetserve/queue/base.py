"""The WorkQueue protocol: the seam between gateways and pulling workers.

Gateways ``publish`` an envelope and a raw body and get a :class:`PendingReply`.
Workers ``pull`` messages for the models they serve, within a cost budget, then
``reply`` and only after that ``ack``. A worker that pulled more than it can batch
``nak``-s the surplus so that it goes back to the queue at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..wire import Envelope, Reply


@dataclass(slots=True)
class Message:
    """One delivery of a published request."""

    envelope: Envelope
    body: bytes
    delivery_id: int
    attempts: int = 1


@runtime_checkable
class PendingReply(Protocol):
    """The gateway's handle on a published request."""

    async def wait(self, timeout: float) -> Reply:
        """The worker's reply; raises ``DeadlineExceeded`` after ``timeout`` seconds."""
        ...

    def cancel(self) -> None:
        """Stop waiting; a reply that still arrives is dropped."""
        ...


@runtime_checkable
class WorkQueue(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, envelope: Envelope, body: bytes) -> PendingReply:
        """Enqueue; raises ``Overloaded`` when the model's bounded queue is full."""
        ...

    async def pull(self, models: Sequence[str], budget: int, timeout: float) -> list[Message]:
        """Up to ``budget`` total cost (at least one message) within ``timeout`` seconds.

        Returns an empty list when nothing arrived in time.
        """
        ...

    async def ack(self, msg: Message) -> None:
        """The message is done; it will not be delivered again."""
        ...

    async def nak(self, msg: Message) -> None:
        """Put the message back at the head of its queue, at once, for any worker."""
        ...

    async def reply(self, msg: Message, reply: Reply) -> None:
        """Send the reply to the gateway that published ``msg``."""
        ...

    def depth(self, model: str) -> int:
        """Messages waiting (not in flight) for ``model``."""
        ...

    @property
    def healthy(self) -> bool: ...
