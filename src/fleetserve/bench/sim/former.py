"""A simulated worker's batch former, on item lengths; the same for pull and push.

Its rules are ``worker.batcher.BatchFormer``'s: while interactive items wait, the next
batch holds only them, unless batch work has waited here for ``age_limit_ms`` without
a batch (then it holds only batch items); the budget is
the interactive cap while interactive work waits and for ``hold_ms`` after the last
interactive request came. A window of the next items of that class (two budgets of
tokens or twice the size cap) is sorted by length and packed while ``max_len * n``
fits the budget.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .puller import Msg

_IDX_BITS = 16  # window slot in the low bits of each item's sort key
_IDX_MASK = (1 << _IDX_BITS) - 1


@dataclass(slots=True)
class Batch:
    tokens: int
    width: int  # the longest item: padded slots are width x n
    n: int
    budget: int  # the budget it was packed for (the cap while interactive work is about)
    done: list[tuple[Msg, int]]  # (message, items of it in this batch)


class Former:
    """One worker's waiting items, by message and class."""

    __slots__ = (
        "age_limit_ms",
        "batch_turn",
        "budget",
        "cap",
        "hi",
        "hi_pending",
        "hold_ms",
        "last_interactive",
        "lo",
        "max_size",
        "pending",
    )

    def __init__(
        self, budget: int, cap: int, max_size: int, age_limit_ms: float, hold_ms: float
    ) -> None:
        if 2 * max_size > _IDX_MASK:
            raise ValueError("batch size cap too large for the simulated former")
        self.budget, self.cap, self.max_size = budget, min(cap, budget), max_size
        self.age_limit_ms, self.hold_ms = age_limit_ms, hold_ms
        self.hi: deque[Msg] = deque()  # interactive
        self.lo: deque[Msg] = deque()  # batch
        self.pending = 0  # tokens not yet batched
        self.hi_pending = 0  # of them interactive
        self.last_interactive = -1e18
        self.batch_turn = 0.0  # when batch work last had a batch (or none waited)

    def __bool__(self) -> bool:
        return bool(self.hi or self.lo)

    def add(self, m: Msg, now: float) -> None:
        m.pulled = now
        left = sum(m.lengths[m.pos :])
        if m.interactive:
            self.last_interactive = now
            self.hi.append(m)
            self.hi_pending += left
        else:
            self.lo.append(m)
        self.pending += left

    def take(self, now: float) -> Batch:
        """The next batch (the former must not be empty)."""
        hi, lo = self.hi, self.lo
        about = bool(hi) or now - self.last_interactive < self.hold_ms
        b = self.cap if about else self.budget
        starved = bool(lo) and now - self.batch_turn > self.age_limit_ms
        src = hi if hi and not starved else lo
        if src is lo or not lo:
            self.batch_turn = now  # batch work has this batch (or none waits)
        lim_n, lim_t = 2 * self.max_size, 2 * b
        win: list[Msg] = []
        keys: list[int] = []
        wtok = 0
        for m in src:
            k = len(win)
            seg = m.lengths[m.pos : m.pos + lim_n - len(keys)]
            s = sum(seg)
            if wtok + s >= lim_t:  # the window ends with the item that fills it
                for j, x in enumerate(seg):
                    wtok += x
                    if wtok >= lim_t:
                        seg = seg[: j + 1]
                        break
            else:
                wtok += s
            keys += [(x << _IDX_BITS) | k for x in seg]
            win.append(m)
            if wtok >= lim_t or len(keys) >= lim_n:
                break
        keys.sort()
        counts = [0] * len(win)
        n = tok = width = 0
        cap_n = self.max_size
        for key in keys:
            x = key >> _IDX_BITS
            if n and (x * (n + 1) > b or n >= cap_n):
                break
            n += 1
            tok += x
            width = x
            counts[key & _IDX_MASK] += 1
        done = [(m, c) for m, c in zip(win, counts, strict=True) if c]
        for m, c in done:
            m.pos += c
        head = [src.popleft() for _ in win]  # the window is a prefix of its class
        src.extendleft(reversed([m for m in head if m.pos < len(m.lengths)]))
        self.pending -= tok
        if src is hi:
            self.hi_pending -= tok
        return Batch(tok, width, n, b, done)
