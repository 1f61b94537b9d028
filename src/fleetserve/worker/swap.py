"""Switching a served model to a new profile between batches, no request failing.

The background tuner finds a better profile for a model that serves, builds a fresh
runner for it (``assembly.build_runner(spec, settings, metrics, choice)``, never run
by a worker: only the carrier of the new profile, its adapter factory and closures)
and calls :func:`swap_profile`. A resident model loads the new profile beside the old
one, within the fleet's memory budget, while the old one keeps serving; then, on the
event loop between two batches, the served runner adopts it. A model that is not
resident adopts it without loading: its next load uses it.

This lives in ``worker`` rather than ``fleet``: it drives runners, and the fleet
manager knows only members (``fleet.member``), never a worker's runner.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass

from ..catalog import Profile
from ..fleet.manager import Fleet, State
from ..fleet.member import is_oom
from ..wire import FleetError
from .runner import Runner

log = logging.getLogger("fleetserve.worker")
MIB = 1 << 20


@dataclass(frozen=True)
class SwapResult:
    """What :func:`swap_profile` did. ``before`` and ``after``: the model's footprint in
    bytes (held while resident, else expected at its next load); ``after`` equals
    ``before`` when it did not swap. ``reason`` says what happened, or why not."""

    swapped: bool
    reason: str
    before: int
    after: int
    seconds: float


async def swap_profile(fleet: Fleet, runner: Runner, new: Runner) -> SwapResult:
    """Make ``runner`` (served by the worker, managed by ``fleet``) serve ``new``'s profile.

    Resident: room for ``new`` is made beside the old profile (the fleet's policy may
    evict other idle models that are not pinned, never this one); without room nothing
    changes and the result says why. ``new`` loads (its loader thread, then its
    warm-up on the shared compute thread) while the old profile keeps serving; then,
    with no await in between, ``runner`` adopts its adapter, profile, footprint and
    batch budgets (queued requests stay queued), and the fleet counts the new
    footprint only. A batch already running finishes on the old adapter; the next one
    runs on the new. Not resident (cold, evicted or failed): it adopts without loading.

    A generation runner (continuous batching) swaps only while no sequence runs or
    waits to start; otherwise the result is refused with reason "busy: running
    sequences", and the caller tries again later.

    A new profile that fails to load, or runs out of memory, leaves the old one
    serving and the room given back: the result says failed, with the reason. None of
    these raise; a ``new`` that is not a runner of the same kind and model is a
    ``TypeError`` (a caller's mistake).
    """
    t0 = time.perf_counter()
    model = runner.model_id
    if type(new) is not type(runner) or new.model_id != model:
        raise TypeError(f"model {model} swaps only to a {type(runner).__name__} of itself")

    def result(
        swapped: bool, reason: str, before: int, after: int | None = None, level: int = 0
    ) -> SwapResult:
        seconds = time.perf_counter() - t0
        out = SwapResult(swapped, reason, before, before if after is None else after, seconds)
        level = level or logging.DEBUG  # the caller's one line says it; refusals: retried
        log.log(level, "%s: profile swap: %s (%.1f s)", model, reason, seconds)
        return out

    busy = runner.cannot_adopt()
    if busy:
        return result(False, busy, runner.expected().total)
    async with fleet.swaps.holding(model) as state:  # no load of it starts, nor eviction
        if state is not State.RESIDENT:
            before = runner.expected().total
            runner.adopt(new)
            await fleet.swaps.settle(model, None)
            why = f"adopted {label(runner)} while {state.value}: its next load uses it"
            return result(True, why, before, runner.expected().total)
        need = new.expected()
        try:
            held = await fleet.swaps.reserve(model, need)
        except FleetError as err:
            return result(False, f"refused: {err.message}", runner.expected().total)
        try:
            got = await new.load()
        except BaseException as exc:  # cancelled too: the room is given back
            await fleet.swaps.settle(model, held)
            if not isinstance(exc, Exception):
                raise
            what = "out of memory" if is_oom(exc) else "failed"
            reason = f"{what} loading {label(new)}: {type(exc).__name__}: {exc}"[:500]
            traceback.clear_frames(exc.__traceback__)  # what the load allocated may go
            return result(False, reason, held.total, level=logging.WARNING)
        busy = runner.cannot_adopt()  # a sequence may have started while it loaded
        if busy:
            new.unload()
            await fleet.swaps.settle(model, held)
            return result(False, busy, held.total)
        runner.adopt(new)  # between batches: nothing awaited since the check
        await fleet.swaps.settle(model, got)
        why = f"swapped to {label(runner)} ({held.total / MIB:.1f} -> {got.total / MIB:.1f} MiB)"
        return result(True, why, held.total, got.total)


def label(runner: Runner) -> str:
    """The profile in a few words: runtime, precision and batch budgets."""
    p: Profile = runner.profile
    return (
        f"{p.runtime or runner.spec.runtime} {p.precision}, batch "
        f"{p.max_batch_size}/{runner.waiting.max_batch_tokens}"
    )


__all__ = ["SwapResult", "swap_profile"]
