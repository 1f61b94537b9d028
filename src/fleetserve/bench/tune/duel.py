"""A duel: the two best points, when the noise cannot tell them apart, measured again in
turns until one is ahead beyond doubt.

Why: the search ranks points by the median of a few 3 s windows, and on a noisy
2-core VM those spread 8 to 11 % (MiniLM on cpu-avx2, 2026-12-04). ONNX Runtime
served the real-text mix 1.07x to 1.12x faster than OpenVINO there (servers side by
side, 8 s windows in turns), yet a background tune measured it at 0.96x and kept
OpenVINO, and two CLI tunes that differed only in which engine was screened first
each picked the other one. Two medians of four windows cannot settle a 10 % gap
against a 10 % spread; many windows in turns can.

How:

- it runs only when the runner-up is within the noise of the best (or the 5 % a tie
  is judged by, whichever is larger); else the order is clear already;
- each round measures both once, the order swapped every round (A B, B A, ...), so
  drift falls on both halves of a round alike; a round gives one ratio, B / A;
- from the third round on, the mean log-ratio is compared with its standard error:
  beyond :data:`Z` standard errors either way, the duel is decided;
- it ends decided, after :data:`ROUNDS` rounds, or when the budget cannot hold
  another round (the final steps' reserve is kept); a point that fails ends it.

Its windows are samples of the two points like any other (their medians and the
noise take them in). The run document keeps it (``duel``); a decided duel picks the
winner over the medians (``steps.choose``), and the background tuner's verdict swaps
on it (``verdict``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import noise

if TYPE_CHECKING:
    from .search import Point, Search

ROUNDS = 8  # at most, each two windows
MIN_ROUNDS = 3  # before a standard error means anything
Z = 2.0  # standard errors of the mean log-ratio that decide it
TIE_BAND = 0.05  # the runner-up within this (or the noise, if larger) of the best


@dataclass
class Duel:
    a: str  # the best point's candidate id when it began
    b: str  # the runner-up's
    ratios: list[float] = field(default_factory=list)  # b / a, one per round

    @property
    def rounds(self) -> int:
        return len(self.ratios)

    @property
    def ratio(self) -> float | None:
        """``b / a``: the geometric mean of the rounds' ratios."""
        if not self.ratios:
            return None
        return math.exp(statistics.fmean(math.log(r) for r in self.ratios))

    @property
    def error(self) -> float | None:
        """The standard error of the mean log-ratio (about a relative error)."""
        if len(self.ratios) < 2:
            return None
        return statistics.stdev(math.log(r) for r in self.ratios) / math.sqrt(len(self.ratios))

    @property
    def decided(self) -> bool:
        ratio, err = self.ratio, self.error
        if ratio is None or err is None or self.rounds < MIN_ROUNDS:
            return False
        return abs(math.log(ratio)) > Z * err

    def leader(self) -> str | None:
        """The candidate id ahead beyond doubt; ``None`` while undecided."""
        if not self.decided:
            return None
        assert self.ratio is not None
        return self.b if self.ratio > 1 else self.a

    def as_dict(self) -> dict[str, object]:
        err = self.error
        return {
            "a": self.a,
            "b": self.b,
            "rounds": self.rounds,
            "ratios": [round(r, 4) for r in self.ratios],
            "ratio": round(self.ratio, 4) if self.ratio is not None else None,
            "error": round(err, 4) if err is not None else None,
            "decided": self.decided,
            "leader": self.leader(),
        }


def line(d: dict[str, object]) -> str:
    """The report's line: ``b vs a: 1.09x over 6 rounds in turns (+-2.1 %), decided``."""
    if not d.get("rounds"):
        return f"`{d['b']}` against `{d['a']}`: no round fitted the budget"
    err = f" (standard error {d['error']:.1%})" if d.get("error") is not None else ""
    how = f"decided for `{d['leader']}`" if d.get("decided") else "undecided"
    return (f"`{d['b']}` against `{d['a']}`: {d['ratio']:.3f}x over {d['rounds']} rounds "
            f"in turns{err}, {how}")  # fmt: skip


def close(s: Search) -> tuple[Point, Point] | None:
    """The two best points, if the noise cannot tell them apart."""
    top = s.measured()[:2]
    if len(top) < 2:
        return None
    a, b = top
    band = max(s.noise, TIE_BAND)
    return (a, b) if b.tokens_per_s >= (1 - band) * a.tokens_per_s else None


async def duel(s: Search) -> Duel | None:
    """Measure the two best in turns while undecided; what it found (``None``: the
    order was clear, no duel)."""
    pair = close(s)
    if pair is None:
        return None
    a, b = pair
    d = Duel(a.cand.id, b.cand.id)
    s.phase = "duel"
    for i in range(ROUNDS):
        if not s.clock.fits(2 * s._measure_cost_s()):
            break
        got: dict[str, float] = {}
        for p in (a, b) if i % 2 == 0 else (b, a):
            n = len(p.samples)
            await s._run_point(p)
            if p.status == "rejected" or len(p.samples) == n:
                noise.update(s)
                return d  # (a failed point: the ranking is the medians')
            got[p.cand.id] = p.samples[-1]
        d.ratios.append(got[b.cand.id] / got[a.cand.id])
        s._changed()
        if d.decided:
            break
    noise.update(s)
    return d


__all__ = ["ROUNDS", "Duel", "Z", "close", "duel", "line"]
