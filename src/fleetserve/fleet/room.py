"""The answer when no model can leave to make room for a load: a 503 naming who holds
the budget and why they stay, with a Retry-After for when room frees."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..wire import Unavailable
from .policy import Resident

MIB = 1 << 20


def no_room(
    model: str,
    need: tuple[int, int],
    budget: int,
    free: int,
    records: Sequence[Resident],
    held: Callable[[str], int],
    now: float,
    cap: float,
) -> Unavailable:
    """``model`` needs ``need`` (its total bytes, its weights) and ``free`` bytes are
    free beside it; ``held`` says what a resident model holds; ``cap`` bounds the
    Retry-After (:func:`frees_in`)."""
    total, weights = need
    return Unavailable(
        f"no room for model {model!r} ({total / MIB:.1f} MiB): the budget of "
        f"{budget / MIB:.1f} MiB is held by models that may not leave now "
        f"({holders(records, held, now)})",
        retry_after=frees_in(records, weights, free, now, cap),
    )


def holders(records: Sequence[Resident], held: Callable[[str], int], now: float) -> str:
    """Who holds the budget and why they stay: pinned, busy, kept alive."""
    out = []
    for r in records:
        why = (
            "pinned"
            if r.pinned
            else "busy"
            if r.busy
            else f"kept alive {r.keep_until - now:.0f}s more"
            if now < r.keep_until
            else ""
        )
        if why:
            out.append(f"{r.model} {held(r.model) / MIB:.1f} MiB {why}")
    return "; ".join(out) or "loads under way"


def frees_in(records: Sequence[Resident], weights: int, free: int, now: float, cap: float) -> float:
    """Seconds until ``weights`` fit beside ``free``, were nothing used meanwhile: the
    keep-alives that must run out first (a busy model is taken to free within a second),
    at most ``cap`` (the cool-down, ``load_retry_after``), which it is too where only
    pinned models stand in the way (nothing will free). The cap: an hour's keep-alive
    is not an hour's Retry-After (an admin release or a model that leaves sooner lets
    it in)."""
    frees = sorted(
        (max(r.keep_until, now + 1.0) if r.busy else max(r.keep_until, now), r.bytes)
        for r in records
        if not r.pinned
    )
    for at, size in frees:
        free += size
        if weights <= free:
            return max(1.0, min(at - now, cap))
    return cap


__all__ = ["frees_in", "holders", "no_room"]
