"""Central queue: the WorkQueue protocol and its implementations.

``memory`` is the embedded default; ``jetstream`` (NATS JetStream, the ``nats`` extra)
joins gateways and workers in separate processes.
"""

from .base import Message, PendingReply, QueueStats, WorkQueue
from .jetstream import JetStreamQueue, StreamOptions
from .memory import MemoryQueue

__all__ = [
    "JetStreamQueue",
    "MemoryQueue",
    "Message",
    "PendingReply",
    "QueueStats",
    "StreamOptions",
    "WorkQueue",
]
