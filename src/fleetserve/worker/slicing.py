"""Slices of a request far larger than one batch, for other workers to share.

A worker that pulled such a request keeps the first slice, about one pull budget of
tokens, and puts the rest back on the queue as parts of about one budget each (see
``wire.Part``). Any worker takes them; their outputs come back to this worker,
which answers the client once, in order.
"""

from __future__ import annotations

from collections.abc import Sequence

SLICE_FACTOR = 2  # a request over this many budgets is sliced


def plan_slices(lengths: Sequence[int], budget: int) -> list[tuple[int, int]] | None:
    """Contiguous item ranges of about ``budget`` tokens each, the first kept here;
    ``None`` when the request is not far larger than one budget."""
    total = sum(lengths)
    if budget < 1 or len(lengths) < 2 or total <= SLICE_FACTOR * budget:
        return None
    ranges: list[tuple[int, int]] = []
    start = spent = 0
    for i, n in enumerate(lengths):
        if i > start and spent + n > budget:
            ranges.append((start, i))
            start, spent = i, 0
        spent += n
    ranges.append((start, len(lengths)))
    return ranges if len(ranges) > 1 else None
