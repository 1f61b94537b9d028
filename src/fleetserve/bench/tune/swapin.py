"""What a finished tune, or a profile tuned elsewhere, does to the model that runs.

- :func:`judge`: after this process's own tune, the run's winner is swapped in when it
  beats the running profile's own point in that run beyond the noise
  (:func:`.verdict.verdict`); otherwise what runs is kept, and takes the tuned
  profile's figures if it is the same profile.
- :func:`adopt`: a profile another worker of the class or another process on this host
  tuned is kept or swapped in as it is (its tune judged it already).

A refused swap leaves the model on what it runs; the profile applies at the next start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from ...catalog import ModelSpec
from ...catalog.profiles import Choice
from .runs import RunStore
from .states import Host, State
from .verdict import describe, same_profile, verdict

log = logging.getLogger("fleetserve.bench.tune")
SWAP_TRIES = 60  # seconds a generation model's swap waits for it to be idle


async def judge(host: Host, spec: ModelSpec, st: State, tune_dir: Path) -> None:
    """Swap ``spec``'s model to what its run found, if it beats what runs beyond the
    noise; ``st`` says what was done and the run's figures."""
    model = spec.id
    running, found = host.choice(model), host.reread(model)
    run_id = found.provenance.get("run") if found.how == "tuned" else None
    run = _run(tune_dir, run_id)
    if run is None:
        st.reason = "the tune wrote no profile this server can read"
        return
    v = verdict(run, running, found, spec.runtime)
    st.run, st.noise = str(run_id), v.noise
    st.before_tokens_s, st.after_tokens_s = v.before, v.after
    if not v.swap:
        st.reason = f"kept {describe(running, spec)}: {v.why}"
        if same_profile(running, found, spec):
            host.keep(model, found)  # what runs is now a tuned profile
        return
    t0 = time.monotonic()
    for _ in range(SWAP_TRIES):  # generation swaps only when no sequence runs
        done, why_not = await host.swap(model, found)
        if done or not why_not.startswith("busy"):
            break
        await asyncio.sleep(1.0)
    if not done:
        st.reason = f"the swap was refused ({why_not}); the profile applies at next start"
        log.warning("%s: %s", model, st.reason)
        return
    st.swaps += 1
    st.reason = f"swapped in {describe(found, spec)}: {v.why}"
    log.info(
        "swapped %s: %s -> %s, %s -> %.0f tokens/s (%s; noise %.1f%%; %.2fs)",
        model, describe(running, spec), describe(found, spec),
        f"{v.before:.0f}" if v.before else "unmeasured", v.after or 0.0, v.why,
        100 * v.noise, time.monotonic() - t0,
    )  # fmt: skip


async def adopt(host: Host, spec: ModelSpec, st: State, found: Choice, by: str) -> None:
    """``found``, tuned by ``by``: kept, and swapped in if it differs from what runs."""
    model = spec.id
    running = host.choice(model)
    st.reason = f"tuned by {by}"
    if found.how != "tuned":
        return
    if same_profile(running, found, spec):
        host.keep(model, found)
        return
    done, why_not = await host.swap(model, found)
    if done:
        st.swaps += 1
        st.after_tokens_s = (found.provenance.get("figures") or {}).get("tokens_per_s")
        log.info("swapped %s: %s -> %s (tuned by %s)", model,
                 describe(running, spec), describe(found, spec), by)  # fmt: skip
    else:
        st.reason += f"; the swap was refused ({why_not}); it applies at next start"


def _run(tune_dir: Path, run_id: object) -> dict[str, Any] | None:
    try:
        return RunStore(tune_dir).get(str(run_id)) if run_id else None
    except KeyError:
        return None


__all__ = ["SWAP_TRIES", "adopt", "judge"]
