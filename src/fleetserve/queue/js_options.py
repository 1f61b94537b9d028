"""The JetStream queue's options: its streams, subjects and consumers' limits.

The bottom of the JetStream modules: every one of them reads these, none of them
is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire import Priority
from ..wire import headers as H


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """What Settings decide about the streams and consumers."""

    prefix: str = "fleetserve"
    storage: str = "file"  # or "memory"
    replicas: int = 1  # copies of each stream across a NATS cluster (JetStream allows 1-5)
    max_depth: int = 1024  # per model: waiting plus in flight
    max_bytes: int = -1
    max_age: float = 3600.0  # seconds a request may sit in the stream
    max_deliver: int = 5
    ack_wait: float = 5.0
    dlq_max_age: float = 7 * 86400.0

    @property
    def stream(self) -> str:
        return f"{self.prefix.upper().replace('.', '_')}_WORK"

    def subject(self, model: str, priority: Priority = Priority.BATCH) -> str:
        """A model's lane for a class: batch work on ``<prefix>.work.<model>``, as
        before classes existed, interactive work on ``<prefix>.work.<model>.i``."""
        base = f"{self.prefix}.work.{H.subject_token(model)}"
        return base if priority is Priority.BATCH else f"{base}.i"
