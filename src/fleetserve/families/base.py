"""The family protocol: load, preprocess, forward, postprocess, warmup.

A family turns request bodies into model inputs and model outputs into reply bodies,
over a :class:`~fleetserve.runtimes.Runtime`. The worker owns batching and threads:
``preprocess`` and ``postprocess`` run on CPU worker threads, ``forward`` on the
dedicated forward thread.

Each family is a :class:`Family` over its own types: the item ``forward`` takes for
one row, the options ``preprocess`` keeps for ``postprocess``, and the output
``forward`` returns for one row. The worker, which holds models of every family and
never looks inside items, options or outputs, sees them as :class:`AnyFamily`.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast, runtime_checkable

import numpy as np

from ..runtimes import Runtime
from ..wire import Envelope, Task
from ..wire.values import Array

ItemT = TypeVar("ItemT")  # what ``forward`` takes for one row
OptionsT = TypeVar("OptionsT")  # what ``preprocess`` keeps for ``postprocess``
OutputT = TypeVar("OutputT")  # what ``forward`` returns for one row


@dataclass(slots=True)
class Prepared(Generic[ItemT, OptionsT]):
    """A decoded, validated, tokenized request, split into independent items.

    An item is whatever ``forward`` takes for one row: usually a list of token ids,
    or a tuple of ids and extra inputs (an image, a label set). ``lengths`` is each
    item's cost in tokens, which the batch former packs by (max length x batch size);
    it defaults to ``len(item)``.
    """

    items: list[ItemT]
    options: OptionsT
    tokens: int  # real tokens after truncation (reported as usage)
    lengths: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.lengths:
            self.lengths = [len(cast(Sized, x)) for x in self.items]
        elif len(self.lengths) != len(self.items):
            raise ValueError("Prepared.lengths must have one entry per item")


class Family(Protocol[ItemT, OptionsT, OutputT]):
    """A model family, typed by its item, options and output types."""

    tasks: frozenset[Task]
    runtime: Runtime  # what it runs on (its name and the precision that runs)

    def load(self) -> None: ...

    def warmup(self) -> None: ...

    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[ItemT, OptionsT]:
        """Decode and validate the body; raise ``InvalidInput`` naming the field."""
        ...

    def forward(self, items: Sequence[ItemT]) -> Sequence[OutputT]:
        """One batch of items (from any requests); returns one output per item, in order.

        An ``np.ndarray`` whose first axis is the batch is a sequence of rows (see
        :func:`rows`)."""
        ...

    def postprocess(
        self, envelope: Envelope, prepared: Prepared[ItemT, OptionsT], outputs: list[OutputT]
    ) -> bytes:
        """Encode the reply body in ``envelope.accept``; ``outputs[i]`` is item i's output."""
        ...

    def memory_bytes(self) -> int: ...


@runtime_checkable
class AnyFamily(Family[Any, Any, Any], Protocol):
    """A family of any types, as the worker holds it."""


@runtime_checkable
class Embeds(Protocol):
    """A family whose rows are vectors of ``dim`` numbers (dense, multivector, image;
    ``dim`` is known once the model loaded)."""

    dim: int


def rows(batch: Array) -> Sequence[Array]:
    """A batch-first array as the sequence of its rows (the array itself: no copy)."""
    return cast(Sequence[Array], batch)


PAD_MULTIPLE = 16
"""Batches of text are padded to a multiple of this many tokens. Runtimes with dynamic
shapes (OpenVINO's CPU plugin, oneDNN under torch) build and keep kernels per input
shape, so with every width from 1 to the model's limit possible their caches grow for
as long as new (batch, width) pairs turn up: the soak measured +7 to +9 % RSS in four
minutes of mixed traffic, neither freed by ``malloc_trim`` nor bounded by smaller
arenas or kernel caches. Sixteen times fewer widths level it off after warm-up (+3 %),
and fewer kernel builds cut latency too. Padded positions are masked: fp32 outputs
stay within 1e-6."""


def padded_width(longest: int, limit: int | None = None, multiple: int = PAD_MULTIPLE) -> int:
    """``longest`` rounded up to a multiple of ``multiple``, never past ``limit`` (the
    model's longest sequence); without a limit, ``longest`` itself."""
    if limit is None:
        return longest
    return max(longest, min(-(-longest // multiple) * multiple, limit))


def pad_batch(
    items: Sequence[list[int]], pad_id: int, limit: int | None = None
) -> tuple[Array, Array]:
    """Right-pad token id lists into ``input_ids`` and ``attention_mask`` (int64), to a
    multiple of :data:`PAD_MULTIPLE` tokens when ``limit`` (the model's longest
    sequence) is given."""
    width = padded_width(max(len(x) for x in items), limit)
    ids = np.full((len(items), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(items), width), dtype=np.int64)
    for i, seq in enumerate(items):
        ids[i, : len(seq)] = seq
        mask[i, : len(seq)] = 1
    return ids, mask
