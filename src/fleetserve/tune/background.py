"""``--tune auto``: the server tunes its models in the background and swaps in what wins.

The server is ready at once on the rules' choice. Each model that runs on the rules,
a fallback, or a stale profile (see :mod:`.stale`) is tuned once it has loaded
(pinned models at start, the others after their first use), one model at a time:

1. a **quick** search (``--tune-budget`` seconds of the tuner's own time), which
   starts from the evidence's pick for this class and its neighbours, then
2. the full search (``--tune-refine-budget``), which refines it.

Each phase is ``fleetserve tune`` itself, run as a child process, so the background
tune shares the CLI's candidates, gates, harness and reports, and measures through the
real runner path. The child is stopped whenever the server has work (see
:mod:`.pauses`: traffic gets every core within one 20 ms poll) and continued once the
server has been idle ``--tune-idle`` seconds; its pauses leave its budget and figures
untouched. The child writes the profile (atomically) and its run document, which the
dashboard shows live; the server then swaps the model to the new profile when it beats
the one running by more than the measured noise. A tune that fails, is killed or is
cut by a model's eviction leaves the model on what it runs.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ..catalog import Catalog, ModelSpec
from ..catalog.profiles import Choice, profile_path, write_profile_text
from ..logs import child_env
from ..settings import Settings
from .fleetwide import FleetTuning
from .pauses import Ledger
from .runs import RunStore
from .stale import model_digest, why_tune
from .tune_child import TuneChild
from .verdict import describe, same_profile, verdict

log = logging.getLogger("fleetserve.tune")
POLL_S = 0.02  # how often the server's load is looked at while a tune runs
LOOK_S = 0.5  # how often loaded models are looked at for one to tune
EVICTED = "the tune stopped: the model was evicted; it is tuned once it loads again"
LATER_S = 2.0  # how often a model another worker tunes is looked at again
SWAP_TRIES = 60  # seconds a generation model's swap waits for it to be idle


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
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class BackgroundTuner:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        host: Host,
        hardware_class: str,
        env: Mapping[str, str] | None = None,
        fleet: FleetTuning | None = None,
    ) -> None:
        """``fleet``: in distributed mode, the profiles and tune leases this worker
        shares with the others of its class (see :mod:`.fleetwide`)."""
        self.settings, self.catalog, self.host = settings, catalog, host
        self.fleet = fleet
        self.cls = hardware_class
        self.env = child_env({**(env or {}), **settings.to_env()})
        self.tune_dir = Path(settings.tune_dir).expanduser()
        self.profile_dir = Path(settings.profile_dir).expanduser()
        self.states = {s.id: State() for s in catalog}
        self._tried: set[str] = set()  # tuned (or failed) in this process: never again
        self._evicted: set[str] = set()  # its tune stopped when it left memory
        self._later: dict[str, float] = {}  # another worker tunes it: look again then
        self._child_run: TuneChild | None = None  # the phase's child, while it runs
        self.ledger: Ledger | None = None

    @property
    def child_pid(self) -> int | None:
        """The running phase's ``fleetserve tune`` process, if one runs."""
        return self._child_run.pid if self._child_run is not None else None

    def info(self, model: str) -> dict[str, Any]:
        return self.states[model].as_dict()

    def refresh(self) -> None:
        """Each model's state from its choice: what needs tuning waits for its turn."""
        for spec in self.catalog:
            st = self.states[spec.id]
            if st.state in ("tuning", "paused", "failed") or spec.id in self._tried:
                continue
            why = self._why(spec)
            loaded = self.host.loaded(spec.id)
            if why is None:
                st.state, st.reason = "tuned", self.host.choice(spec.id).reason
            elif spec.id in self._evicted and not loaded:
                st.state, st.reason = "rules", EVICTED
            else:
                self._evicted.discard(spec.id)
                st.state, st.reason = ("waiting" if loaded else "rules"), why

    def _why(self, spec: ModelSpec) -> str | None:
        if spec.runtime == "external":
            return None
        choice = self.host.choice(spec.id)
        if choice.how not in ("rule", "fallback") and not self.host.loaded(spec.id):
            return None  # a tuned file is judged by the weights once they are resolved
        try:
            digest = model_digest(spec, self.host.weights(spec.id))
        except Exception:  # weights not here yet: the model cannot have loaded either
            return None
        return why_tune(choice, digest, refine=self.settings.tune_refine_budget > 0)

    async def run(self) -> None:
        """Tune, one model at a time, for as long as the server runs."""
        if not self._writable():
            return
        self.tune_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(Path(tempfile.mkdtemp(dir=self.tune_dir, prefix=".pauses-")) / "l")
        helpers = [asyncio.create_task(self._watch(), name="tune-pauses")]
        if self.fleet is not None:
            helpers.append(asyncio.create_task(self.fleet.renew_forever(), name="tune-leases"))
            helpers.append(asyncio.create_task(self._shared_forever(), name="tune-profiles"))
        try:
            await self._loop()
        finally:
            for t in helpers:
                t.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._stop_child()
            if self.fleet is not None:
                for model in list(self.fleet.held):
                    await self.fleet.release(model)

    async def _shared_forever(self) -> None:
        """The shared profiles, watched again after a broker outage."""
        assert self.fleet is not None
        while True:
            try:
                await self.fleet.watch(self._shared)
            except Exception as exc:
                log.debug("shared profiles: watch ended (%s); watching again", exc)
            await asyncio.sleep(LATER_S)

    async def _loop(self) -> None:
        while True:
            self.refresh()
            model = await self._next()
            if model is None:
                await asyncio.sleep(LOOK_S)
                continue
            try:
                await self._tune(model)
            except Exception as exc:  # a tune never takes the server down
                self._failed(model, f"{type(exc).__name__}: {exc}")
            finally:
                if self.fleet is not None:
                    await self.fleet.release(model)

    async def _next(self) -> str | None:
        """The next model to tune: waiting, and (fleet-wide) its lease is ours."""
        now = time.monotonic()
        for m, st in self.states.items():
            if st.state != "waiting" or self._later.get(m, 0.0) > now:
                continue
            if self.fleet is None:
                return m
            if await self.fleet.claim(m):
                got = await self.fleet.get(m)  # shared just before the lease was freed?
                if got is None or got[1] == self.fleet.owner:
                    return m
                await self.fleet.release(m)
                await self._shared(m, *got)
                continue
            holder = await self.fleet.holder(m)
            st.reason = f"{holder or 'another worker'} tunes it; its profile is shared"
            self._later[m] = now + LATER_S
        return None

    async def _shared(self, model: str, text: str, by: str) -> None:
        """A profile another worker of this class tuned: kept, and swapped in."""
        assert self.fleet is not None
        if by == self.fleet.owner or model not in self.states:
            return
        write_profile_text(self.profile_dir, model, self.cls, text)
        running, found = self.host.choice(model), self.host.reread(model)
        st = self.states[model]
        spec = self.catalog.get(model)
        if st.state not in ("tuning", "paused"):  # (ours, under the lease, goes on)
            self._tried.add(model)  # the holder of its lease tunes it for the fleet
            st.state, st.phase = "tuned", ""
        st.reason = f"tuned by {by}"
        if found.how != "tuned":
            return
        if same_profile(running, found, spec):
            self.host.keep(model, found)
            return
        done, why_not = await self.host.swap(model, found)
        if done:
            st.swaps += 1
            st.after_tokens_s = (found.provenance.get("figures") or {}).get("tokens_per_s")
            log.info("swapped %s: %s -> %s (tuned by %s)", model,
                     describe(running, spec), describe(found, spec), by)  # fmt: skip
        else:
            st.reason += f"; the swap was refused ({why_not}); it applies at next start"

    def _writable(self) -> bool:
        """One warning, and no tuning, when profiles cannot be written."""
        try:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.profile_dir):
                pass
        except OSError as exc:
            log.warning(
                "--tune auto: profile directory %s is not writable (%s); serving on what "
                "runs, not tuning",
                self.profile_dir,
                exc.strerror or exc,
            )
            for st in self.states.values():
                st.error = f"profile directory not writable: {exc.strerror or exc}"
            return False
        return True

    async def _tune(self, model: str) -> None:
        st = self.states[model]
        choice = self.host.choice(model)
        refine_only = choice.how == "tuned" and bool(choice.provenance.get("quick"))
        phases = [] if refine_only else [True]
        if self.settings.tune_refine_budget > 0:
            phases.append(False)
        for quick in phases:
            st.state, st.phase, st.error = "tuning", "quick" if quick else "full", None
            rc, tail = await self._child(model, quick=quick)
            if rc is None:  # evicted mid-tune: it waits to load again
                st.state, st.phase, st.reason = "rules", "", EVICTED
                self._evicted.add(model)
                return
            if rc != 0:
                self._failed(model, tail or f"fleetserve tune exited {rc}")
                return
            await self._judge(model, st)
            await self._publish(model)
        st.state, st.phase = "tuned", ""
        self._tried.add(model)

    async def _publish(self, model: str) -> None:
        """Fleet-wide: the profile this worker's tune wrote, for the others of its class."""
        if self.fleet is None:
            return
        try:
            text = profile_path(self.profile_dir, model, self.cls).read_text()
            await self.fleet.publish(model, text)
        except Exception as exc:  # the others tune it themselves
            log.warning("%s: the profile was not shared (%s)", model, exc)

    def _failed(self, model: str, error: str) -> None:
        st = self.states[model]
        st.state, st.phase, st.error = "failed", "", error
        log.warning("%s: the background tune failed (%s); keeping its profile", model, error)
        self._tried.add(model)  # not again in this process: no loop of failing tunes

    async def _judge(self, model: str, st: State) -> None:
        """Swap ``model`` to what the run found, if it beats what runs beyond the noise."""
        running, found = self.host.choice(model), self.host.reread(model)
        run_id = found.provenance.get("run") if found.how == "tuned" else None
        run = _run(self.tune_dir, run_id)
        if run is None:
            st.reason = "the tune wrote no profile this server can read"
            return
        spec = self.catalog.get(model)
        v = verdict(run, running, found, spec.runtime)
        st.run, st.noise = str(run_id), v.noise
        st.before_tokens_s, st.after_tokens_s = v.before, v.after
        if not v.swap:
            st.reason = f"kept {describe(running, spec)}: {v.why}"
            if same_profile(running, found, spec):
                self.host.keep(model, found)  # what runs is now a tuned profile
            return
        t0 = time.monotonic()
        for _ in range(SWAP_TRIES):  # generation swaps only when no sequence runs
            done, why_not = await self.host.swap(model, found)
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

    async def _child(self, model: str, *, quick: bool) -> tuple[int | None, str]:
        """Run one phase; (exit code, its last error line). ``None``: stopped because
        the model left memory."""
        assert self.ledger is not None
        s = self.settings
        budget = s.tune_budget if quick else s.tune_refine_budget
        self._child_run = child = TuneChild(self.env, self.profile_dir, self.tune_dir, self.ledger)
        log.info("%s: tuning in the background (%s search, %gs of its own time)",
                 model, "quick" if quick else "full", budget)  # fmt: skip

        def stop_why() -> str | None:
            if not self.host.loaded(model):
                log.info("%s: evicted; its background tune stops", model)
                return "evicted"
            if self.fleet is not None and not self.fleet.holds(model):
                return "the tune lease was lost"  # another worker may tune it now
            return None

        try:
            rc, tail = await child.run(model, budget, quick, stop_why)
        finally:
            self._child_run = None
        if rc is None and tail != "evicted":
            return 1, tail
        return rc, tail

    async def _watch(self) -> None:
        """Pause the child while the server has work; continue it after ``tune_idle``."""
        assert self.ledger is not None
        idle_since = time.monotonic()
        while True:
            if self.host.busy():
                self.ledger.pause()
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= self.settings.tune_idle:
                self.ledger.resume()
            for st in self.states.values():
                if st.state in ("tuning", "paused"):
                    st.state = "paused" if self.ledger.paused else "tuning"
            await asyncio.sleep(POLL_S)

    async def _stop_child(self) -> None:
        if self._child_run is not None:
            await self._child_run.stop()


def _run(tune_dir: Path, run_id: object) -> dict[str, Any] | None:
    try:
        return RunStore(tune_dir).get(str(run_id)) if run_id else None
    except KeyError:
        return None


__all__ = ["BackgroundTuner", "Host", "State"]
