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
cut by a model's eviction leaves the model on what it runs. One process per host
tunes at a time (:mod:`.hostlock`): co-located workers take turns, and the child
steps aside for any of their traffic (:mod:`.hosttraffic`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from ...catalog import Catalog, ModelSpec
from ...catalog.profiles import Choice, profile_path, write_profile_text
from ...settings import Settings
from . import swapin
from .fleetwide import FleetTuning
from .hostlock import HostLock
from .hosttraffic import HostTraffic, path_for
from .pauses import Ledger, WriteError, open_ledger
from .runs import new_run_id
from .stale import model_digest, why_tune
from .states import Host, State
from .tune_child import TuneChild, tune_env

log = logging.getLogger("fleetserve.bench.tune")
POLL_S = 0.02  # how often the server's load is looked at while a tune runs
LOOK_S = 0.5  # how often loaded models are looked at for one to tune
EVICTED = "the tune stopped: the model was evicted; it is tuned once it loads again"
LATER_S = 2.0  # how often a model another worker tunes is looked at again
OUTGREW = "stopped for memory"
MIB = 1 << 20


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
        self.env = tune_env(settings, env or {})
        self.tune_dir = Path(settings.tune_dir).expanduser()
        self.profile_dir = Path(settings.profile_dir).expanduser()
        self.states = {s.id: State() for s in catalog}
        self._tried: set[str] = set()  # tuned (or failed) in this process: never again
        self._evicted: set[str] = set()  # its tune stopped when it left memory
        self._later: dict[str, float] = {}  # another worker tunes it: look again then
        self._digests: dict[str, str] = {}  # model_digest of each loaded model
        self._by: dict[str, str] = {}  # the worker whose shared profile it runs
        self._child_run: TuneChild | None = None  # the phase's child, while it runs
        self.ledger: Ledger | None = None
        self.hostlock = HostLock(Path(settings.tune_lock) if settings.tune_lock else None)
        self.traffic = HostTraffic(path_for(self.hostlock.path))  # the host's, not only ours

    @property
    def child_pid(self) -> int | None:
        """The running phase's ``fleetserve tune`` process, if one runs."""
        return self._child_run.pid if self._child_run is not None else None

    def info(self, model: str) -> dict[str, object]:
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
                by = self._by.get(spec.id)
                st.state = "tuned"
                st.reason = f"tuned by {by}" if by else self.host.choice(spec.id).reason
            elif spec.id in self._evicted and not loaded:
                st.state, st.reason = "rules", EVICTED
            else:
                self._evicted.discard(spec.id)
                st.state, st.reason = ("waiting" if loaded else "rules"), why

    def _why(self, spec: ModelSpec) -> str | None:
        if spec.runtime == "external":
            return None
        choice = self.host.choice(spec.id)
        if not self.host.loaded(spec.id):  # its weights are judged once it loaded
            return f"it runs on a {choice.how}" if choice.how in ("rule", "fallback") else None
        digest = self._digests.get(spec.id)
        if digest is None:
            try:  # (resolved already: it loaded; read once, a few KiB per file)
                digest = self._digests[spec.id] = model_digest(spec, self.host.weights(spec.id))
            except Exception:
                return None
        return why_tune(choice, digest, refine=self._refine)

    @property
    def _refine(self) -> bool:
        return self.settings.tune_refine_budget > 0

    async def run(self) -> None:
        """Tune, one model at a time, for as long as the server runs."""
        if not self._writable():
            return
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
            self.traffic.close()
            if self.ledger is not None:
                shutil.rmtree(self.ledger.path.parent, ignore_errors=True)

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
            model = None
            try:
                self.refresh()
                model = await self._next()
            except Exception as exc:  # the broker, a shared profile: look again later
                log.warning("--tune auto: %s: %s", type(exc).__name__, exc)
            if model is not None and not self.hostlock.try_acquire():
                self._host_busy(model)
                if self.fleet is not None:
                    await self.fleet.release(model)  # (a worker on another host may tune it)
                model = None
            if model is None:
                await asyncio.sleep(LOOK_S)
                continue
            try:
                if await self._tuned_beside(model):
                    continue
                await self._tune(model)
            except Exception as exc:  # a tune never takes the server down
                self._failed(model, f"{type(exc).__name__}: {exc}")
            finally:
                self.hostlock.release()  # the others on this host take their turn
                if self.fleet is not None:
                    await self.fleet.release(model)

    async def _tuned_beside(self, model: str) -> bool:
        """Another process on this host (a device of the same worker, a co-located
        one) tuned ``model`` while this one waited its turn: its fresh profile is on
        disk, so it is adopted rather than tuned again."""
        found = self.host.reread(model)
        digest = self._digests.get(model, "")
        if found.how != "tuned" or why_tune(found, digest, refine=self._refine) is not None:
            return False
        await self._adopt(model, found, "another process on this host")
        st = self.states[model]
        st.state, st.phase = "tuned", ""
        self._tried.add(model)
        return True

    def _host_busy(self, model: str) -> None:
        holder = self.hostlock.holder()
        who = f"process {holder}" if holder else "another process"
        self.states[model].reason = f"{who} on this host tunes; this one waits its turn"
        self._later[model] = time.monotonic() + LATER_S

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
                if got is not None and got[1] != self.fleet.owner:
                    try:
                        await self._shared(m, *got)
                    except Exception as exc:  # it does not parse: tune it here
                        log.warning("%s: the profile %s shared is not used: %s", m, got[1], exc)
                    else:
                        if self._why(self.catalog.get(m)) is None:
                            await self.fleet.release(m)  # fresh: nothing to tune
                            continue
                return m  # ours to tune (stale or quick shared profiles included)
            holder = await self.fleet.holder(m)
            st.reason = f"{holder or 'another worker'} tunes it; its profile is shared"
            self._later[m] = now + LATER_S
        return None

    async def _shared(self, model: str, text: str, by: str) -> None:
        """A profile another worker of this class tuned: kept, and swapped in."""
        assert self.fleet is not None
        if by == self.fleet.owner or model not in self.states:
            return
        await asyncio.to_thread(write_profile_text, self.profile_dir, model, self.cls, text)
        await self._adopt(model, self.host.reread(model), by)

    async def _adopt(self, model: str, found: Choice, by: str) -> None:
        self._by[model] = by
        await swapin.adopt(self.host, self.catalog.get(model), self.states[model], found, by)

    def _writable(self) -> bool:
        """One warning, and no tuning, when profiles or runs cannot be written; else
        the ledger."""
        try:
            self.ledger = open_ledger(self.profile_dir, self.tune_dir)
        except WriteError as exc:
            log.warning("--tune auto: %s; serving on what runs, not tuning", exc)
            for st in self.states.values():
                st.error = f"profile directory not writable: {exc.why}"
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
            st.memory_bytes = None
            rc, tail = await self._child(model, quick=quick)
            if rc is None:  # evicted mid-tune: it waits to load again
                st.state, st.phase, st.reason = "rules", "", EVICTED
                self._evicted.add(model)
                return
            if rc != 0:
                error = tail or f"fleetserve tune exited {rc}"
                if quick and len(phases) > 1 and not error.startswith(OUTGREW):  # it lacked time
                    log.info("%s: the quick search failed (%s); the full one follows",
                             model, error)  # fmt: skip
                    st.reason = f"the quick search failed: {error}"
                    continue
                self._failed(model, error)
                return
            await swapin.judge(self.host, self.catalog.get(model), st, self.tune_dir)
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
            return self._outgrown(model, child)

        try:
            p = self.host.choice(model).profile  # what runs is screened first
            start = f"{p.runtime or self.catalog.get(model).runtime}:{p.precision}"
            run_id = new_run_id(model, self.cls)  # shown while it runs
            self.states[model].run = run_id
            rc, tail = await child.run(model, budget, quick, stop_why, start, run_id)
        finally:
            self._child_run = None
        if rc is None and tail != "evicted":
            return 1, tail
        return rc, tail

    def _outgrown(self, model: str, child: TuneChild) -> str | None:
        """Why the tune must stop for memory: its child beside the models would pass the
        memory budget (serving keeps the memory; the tune is not retried until the next
        start). Looked at twice a second; the peak is the state's ``memory_bytes``."""
        st, rss = self.states[model], child.rss()
        st.memory_bytes = max(st.memory_bytes or 0, rss) or None
        used, budget = self.host.memory()
        if used + rss <= budget:
            return None
        why = (f"{OUTGREW}: its {rss / MIB:.0f} MiB beside the models' {used / MIB:.0f} MiB "
               f"passed --memory-budget ({budget / MIB:.0f} MiB)")  # fmt: skip
        return why  # (the failed tune's one warning says it)

    async def _watch(self) -> None:
        """Pause the child while this server, or another fleetserve process on this
        host, has work; continue it after ``tune_idle``."""
        assert self.ledger is not None
        idle_since = time.monotonic()
        while True:
            try:
                mine = self.host.busy()
                self.traffic.publish(mine)
                if mine or (self._child_run is not None and self.traffic.others()):
                    self.ledger.pause()
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self.settings.tune_idle:
                    self.ledger.resume()
            except Exception as exc:  # (a full disk for the ledger): stop to be safe
                log.debug("pause ledger: %s", exc)
            for st in self.states.values():
                if st.state in ("tuning", "paused"):
                    st.state = "paused" if self.ledger.paused else "tuning"
            await asyncio.sleep(POLL_S)

    async def _stop_child(self) -> None:
        if self._child_run is not None:
            await self._child_run.stop()


__all__ = ["BackgroundTuner", "Host", "State"]
