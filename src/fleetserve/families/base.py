"""The family adapter protocol: load, preprocess, forward, postprocess, warmup.

A family turns request bodies into model inputs and model outputs into reply bodies,
over a :class:`~fleetserve.runtimes.Runtime`. The worker owns batching and threads:
``preprocess`` and ``postprocess`` run on CPU worker threads, ``forward`` on the
dedicated forward thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..wire import Envelope, Task


@dataclass(slots=True)
class Prepared:
    """A decoded, validated, tokenized request, split into independent items."""

    items: list[list[int]]  # token ids per item; the batch former packs these
    options: Any
    tokens: int  # real tokens after truncation (reported as usage)


@runtime_checkable
class FamilyAdapter(Protocol):
    tasks: frozenset[Task]

    def load(self) -> None: ...

    def warmup(self) -> None: ...

    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared:
        """Decode and validate the body; raise ``InvalidInput`` naming the field."""
        ...

    def forward(self, items: Sequence[list[int]]) -> np.ndarray[Any, Any]:
        """One batch; returns one output row per item, in order."""
        ...

    def postprocess(
        self, envelope: Envelope, prepared: Prepared, outputs: np.ndarray[Any, Any]
    ) -> bytes:
        """Encode the reply body in ``envelope.accept``."""
        ...

    def memory_bytes(self) -> int: ...


def pad_batch(
    items: Sequence[list[int]], pad_id: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Right-pad token id lists into ``input_ids`` and ``attention_mask`` (int64)."""
    width = max(len(x) for x in items)
    ids = np.full((len(items), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(items), width), dtype=np.int64)
    for i, seq in enumerate(items):
        ids[i, : len(seq)] = seq
        mask[i, : len(seq)] = 1
    return ids, mask
