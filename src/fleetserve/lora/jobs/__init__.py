"""Fine-tuning jobs: their queue, store and runner."""

from .queue import JobQueue, JobRef, Lease, MemoryJobQueue
from .queue_js import JetStreamJobQueue

__all__ = ["JetStreamJobQueue", "JobQueue", "JobRef", "Lease", "MemoryJobQueue"]
