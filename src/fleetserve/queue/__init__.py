"""Central queue: the WorkQueue protocol and its implementations."""

from .base import Message, PendingReply, WorkQueue
from .memory import MemoryQueue

__all__ = ["MemoryQueue", "Message", "PendingReply", "WorkQueue"]
