"""Central queue: the Publisher and Consumer protocols and their implementations.

``memory`` is the embedded default; ``jetstream`` (NATS JetStream, the ``nats`` extra)
joins gateways and workers in separate processes.
"""

from .base import Consumer, Message, PendingReply, Publisher, QueueStats, WorkQueue
from .jetstream import JetStreamQueue, StreamOptions
from .memory import MemoryQueue

__all__ = [
    "Consumer",
    "JetStreamQueue",
    "MemoryQueue",
    "Message",
    "PendingReply",
    "Publisher",
    "QueueStats",
    "StreamOptions",
    "WorkQueue",
]
