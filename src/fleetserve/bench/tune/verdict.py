"""Whether a background tune's winner replaces the profile a model runs on.

The winner must beat the running profile's own point, measured in the same run (so
on the same machine, in the same minutes), by more than that run's noise, or have won
a duel against it (``tune.duel``: the two in turns until one is ahead beyond doubt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...catalog import ModelSpec, Profile
from ...catalog.profiles import Choice

NOISE_FLOOR = 0.02  # a run that repeated nothing still gets no swap for a 1% gain
# profiles with no measurement behind them: their cost model is the family's default,
# so they have no interactive cap (catalog/profiles.py). The 110M user model's
# OpenVINO fp32 on cpu-avx2 served 4 clients x 16 texts at 355 tokens/s on the rules'
# profile and 543 on the same engine with a tuned profile's cost model and cap
UNMEASURED = ("rule", "fallback")


@dataclass(frozen=True)
class Verdict:
    swap: bool
    why: str
    before: float | None  # tokens/s of the running profile in the run (None: not tried)
    after: float | None  # the winner's
    noise: float


def verdict(run: dict[str, Any], running: Choice, found: Choice, spec_runtime: str) -> Verdict:
    """Swap when the winner beats the running profile's own point in the same run by
    more than the run's noise (or at all, within it, when what runs is a rule's or a
    fallback's profile); where the run tried its engine at other batch budgets only,
    the best of those stands in for it. An engine the run did not try at all is
    kept: a winner of a search cut short is no evidence against it (a quick search
    that swapped openvino bf16 for torch bf16 at 0.5x taught this)."""
    noise = max(NOISE_FLOOR, float(run.get("noise") or 0.0))
    after = (found.provenance.get("figures") or {}).get("tokens_per_s")
    after = float(after) if after else None
    if _same(running.profile, found.profile, spec_runtime):
        return Verdict(False, "the tune chose what already runs", after, after, noise)
    before = _measured(run, running, spec_runtime)
    if after is None:
        return Verdict(False, "the run has no figure for its winner", before, after, noise)
    if before is None:  # (the search screens it first: only a cut-short run lacks it)
        why = "the run did not measure the running profile's engine: no evidence to swap"
        return Verdict(False, why, None, after, noise)
    won = _duel_gain(run, running.profile, found.profile, spec_runtime)
    if won is not None:
        gain, rounds = won
        why = (f"{gain:+.1%} over {rounds} rounds in turns with the running profile (a "
               f"duel), beyond doubt; the noise between windows is {noise:.1%}")  # fmt: skip
        return Verdict(True, why, before, after, noise)
    gain = after / before - 1 if before else float("inf")
    if gain <= noise and gain >= 0 and running.how in UNMEASURED:
        why = (
            f"{gain:+.1%}, within the noise ({noise:.1%}), over a {running.how}'s profile: "
            "a tie goes to the tuned one, whose batching comes from a fitted cost model"
        )
        return Verdict(True, why, before, after, noise)
    if gain <= noise:
        why = f"{gain:+.1%} is within the noise ({noise:.1%})"
        return Verdict(False, why, before, after, noise)
    return Verdict(True, f"{gain:+.1%}, beyond the noise ({noise:.1%})", before, after, noise)


def _duel_gain(
    run: dict[str, Any], running: Profile, found: Profile, spec_runtime: str
) -> tuple[float, int] | None:
    """(the winner's gain, rounds) where the run's duel (``tune.duel``) was decided for
    the winner against the running profile's own point; else ``None``."""
    d = run.get("duel") or {}
    if not d.get("decided") or not d.get("ratio"):
        return None
    by_id = {c.get("id"): c for c in run.get("candidates") or []}
    a, b = by_id.get(d.get("a")), by_id.get(d.get("b"))
    if a is None or b is None:
        return None
    ratio = float(d["ratio"])  # b / a
    for w, other, gain in ((b, a, ratio - 1), (a, b, 1 / ratio - 1)):
        if _is(w, found, spec_runtime) and _is(other, running, spec_runtime) and gain > 0:
            return gain, int(d.get("rounds") or 0)
    return None


def _is(c: dict[str, Any], p: Profile, spec_runtime: str) -> bool:
    """Whether the run's candidate ``c`` ran profile ``p``'s engine, batch and processes."""
    return (c.get("runtime"), c.get("precision")) == _engine(p, spec_runtime) and (
        c.get("max_batch_tokens"), c.get("max_batch_size"), c.get("processes", 1)
    ) == (p.max_batch_tokens, p.max_batch_size, p.processes)  # fmt: skip


def _engine(p: Profile, spec_runtime: str) -> tuple[str, str]:
    return (p.runtime or spec_runtime, p.precision)


def _same(a: Profile, b: Profile, spec_runtime: str) -> bool:
    return _engine(a, spec_runtime) == _engine(b, spec_runtime) and (
        a.max_batch_tokens, a.max_batch_size) == (b.max_batch_tokens, b.max_batch_size)  # fmt: skip


def _measured(run: dict[str, Any], running: Choice, spec_runtime: str) -> float | None:
    """The run's figure for the running profile: its engine at its batch budget, else
    the best of its engine at any budget (so a swap must beat that), else ``None``."""
    p = running.profile
    engine = _engine(p, spec_runtime)
    exact, best = None, None
    for c in run.get("candidates") or []:
        if (c.get("runtime"), c.get("precision")) != engine or c.get("processes", 1) != 1:
            continue
        tps = c.get("tokens_per_s")
        if not tps:
            continue
        if (c.get("max_batch_tokens"), c.get("max_batch_size")) == (
            p.max_batch_tokens,
            p.max_batch_size,
        ):
            exact = float(tps)
        best = max(best or 0.0, float(tps))
    return exact if exact is not None else best


def same_profile(a: Choice, b: Choice, spec: ModelSpec) -> bool:
    """Whether ``a`` and ``b`` run the same engine at the same batch budget."""
    return _same(a.profile, b.profile, spec.runtime)


def describe(choice: Choice, spec: ModelSpec) -> str:
    p = choice.profile
    return f"{p.runtime or spec.runtime} {p.precision} {p.max_batch_size}/{p.max_batch_tokens}"


__all__ = ["Verdict", "describe", "same_profile", "verdict"]
