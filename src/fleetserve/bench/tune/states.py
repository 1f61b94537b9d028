"""What the background tuner (:mod:`.background`) needs of its host, and what it
says of each model (``GET /v1/models``' ``tuning``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from ...catalog.profiles import Choice


class Host(Protocol):
    """What the background tuner needs of the server it tunes for."""

    def choice(self, model: str) -> Choice:
        """The profile ``model`` runs on."""
        ...

    def reread(self, model: str) -> Choice:
        """The profile ``model`` would run on, with the profile files read again."""
        ...

    def loaded(self, model: str) -> bool:
        """``model`` is resident (a tune stops when it is evicted)."""
        ...

    def busy(self) -> bool:
        """Requests wait or run: the tune must step aside."""
        ...

    def memory(self) -> tuple[int, int]:
        """(bytes its models hold, its memory budget): a tune's child must fit beside."""
        ...

    def weights(self, model: str) -> Path: ...

    async def swap(self, model: str, choice: Choice) -> tuple[bool, str]:
        """Serve ``model`` with ``choice`` from its next batch; (done, why not)."""
        ...

    def keep(self, model: str, choice: Choice) -> None:
        """``choice`` holds the profile ``model`` runs already: it is its choice now."""
        ...


@dataclass
class State:
    """One model's tuning, as ``GET /v1/models`` shows it (``tuning``)."""

    state: str = "off"  # off, rules, waiting, tuning, paused, tuned, failed
    reason: str = ""
    phase: str = ""  # quick or full, while tuning
    run: str | None = None  # the run document's id (GET /v1/tuning/runs/{id})
    before_tokens_s: float | None = None  # the running profile's figure in that run
    after_tokens_s: float | None = None  # the winner's
    noise: float | None = None
    swaps: int = 0
    memory_bytes: int | None = None  # the tune's child's peak resident memory, this phase
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


__all__ = ["Host", "State"]
