"""The state of one message a worker holds, as its ledger (``worker.ledger``) keeps it.

Only the ledger moves a record from one state to the next; runners, the batch former
and the generation thread read it (``Job.settled``) to drop work that is over.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..queue import Message


class State(enum.Enum):
    PARKED = "parked"  # its model loads; not prepared yet
    HEATING = "heating"  # prepared; its LoRA adapter loads
    BATCHED = "batched"  # in a batch former or a wait queue
    RUNNING = "running"  # in a forward pass or generating (some of it has started)
    STREAMING = "streaming"  # its client has had chunks: a retry would repeat them
    SETTLED = "settled"  # answered, expired, cancelled, dead-lettered or given back


@dataclass(eq=False, slots=True)
class Record:
    """One message held, and where it stands."""

    msg: Message
    state: State = State.PARKED

    @property
    def settled(self) -> bool:
        return self.state is State.SETTLED
