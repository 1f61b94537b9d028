"""Tune one model end to end: search, choose, measure the winner, write the profile
and the report, and keep the run document (the dashboard's view) current.

Nothing is written to the profile directory until the very end, atomically: Ctrl-C,
a crash or a budget that runs out leave the old profile (or none) in place, and the
run document says ``cancelled`` or ``failed``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from ... import __version__
from ...catalog import CostModel, ModelSpec, Profile
from ...catalog.hardware import Hardware
from ...catalog.profiles import profile_path, write_profile_file
from . import adapter_path, duel, noise, report, screening, steps
from .runs import RunStore, new_run_id, now_iso
from .search import Options, Search, TuneError
from .stale import model_digest
from .workload import requests


@dataclasses.dataclass(frozen=True)
class Outcome:
    run: dict[str, Any]
    profile_file: Path | None


class Tuner:
    def __init__(
        self,
        spec: ModelSpec,
        path: Path,
        hw: Hardware,
        hardware_class: str,
        opts: Options,
        store: RunStore,
        *,
        profile_dir: Path,
        report_dir: Path,
        catalog_dirs: tuple[Path, ...] = (),
        console: Console | None = None,
        run_id: str = "",
    ) -> None:
        """``run_id``: the run document's id (a new one when empty)."""
        self.run_id = run_id
        self.spec, self.hw, self.cls, self.opts = spec, hw, hardware_class, opts
        self.store = store
        self.profile_dir, self.report_dir = profile_dir, report_dir
        self.console = console or Console(stderr=True)
        self.search = Search(spec, path, hw, hardware_class, opts, self._changed, catalog_dirs)
        self.digest = model_digest(spec, path)
        self.run_doc: dict[str, Any] = {
            "version": 1,
            "id": new_run_id(spec.id, hardware_class),
            "model": spec.id,
            "family": spec.family,
            "hardware_class": hardware_class,
            "machine": hw.summary(),
            "facts": hw.facts(),
            "fleetserve": __version__,
            "status": "running",
            "phase": "quality",
            "started_at": now_iso(),
            "finished_at": None,
            "budget_s": opts.budget_s,
            "elapsed_s": 0.0,
            "noise": 0.0,
            "noise_method": noise.METHOD,
            "noise_repeats": 0,  # measurements the noise was computed from
            "noise_points": 0,  # candidates they measured
            "noise_range": 0.0,  # the old (max - min) / median of the same, for comparison
            "steal": None,  # CPU steal over the measured windows; null where unknown
            "workload": "chats of up to 32 tokens" if spec.family == "generate" else opts.workload,
            "clients": opts.clients,
            "batch": opts.batch,
            "measure_s": opts.measure_s,
            "quick": opts.quick,
            "candidates": [],
            "winner": None,
            "knee": None,
            "duel": None,  # the two best in turns, where the noise could not part them
            "profile": None,
            "cost_fit": None,
            "adapters": None,  # where the winner's LoRA adapters run, and the slots' gate
            "report": None,
            "error": None,
            "warnings": [],
            "notes": [],
        }
        self._last_write = 0.0

    def _changed(self, phase: str, force: bool = False) -> None:
        s = self.search
        doc = self.run_doc
        if doc["finished_at"] is None:  # the report written after is not in its time
            doc["elapsed_s"] = round(s.clock.elapsed, 1)
        doc.update(
            phase=phase,
            noise=s.noise,
            noise_repeats=s.noise_repeats,
            noise_points=s.noise_points,
            noise_range=s.noise_range,
            steal=s.steal,
            candidates=[p.as_dict() for p in s.points],
            knee=s.knee,
            cost_fit=s.cost_fit,
        )
        now = time.monotonic()
        if force or now - self._last_write > 0.5:
            self._last_write = now
            self.store.write(doc)

    async def run(self) -> Outcome:
        s = self.search
        doc = self.run_doc
        s.start()  # this model's budget starts now, not when the command started
        doc.update(id=self.run_id or new_run_id(self.spec.id, self.cls), started_at=now_iso())
        self._changed("quality", force=True)
        try:
            s.requests = requests(self.spec, s.path, self.opts.workload, self.opts.batch)
            s.notes = doc["notes"]  # (one list: the search's notes are the run's)
            await screening.screen(s)
            await steps.compile_probe(s)
            await noise.measure(s)
            await s.batches()
            await steps.threads(s)
            await noise.measure(s, rounds=noise.ROUNDS)
            fight = None if self.opts.quick else await duel.duel(s)
            doc["duel"] = fight.as_dict() if fight is not None else None
            doc["warnings"] += noise.warnings(s)
            winner = steps.choose(s, fight)
            knee = self.opts.knee and self.spec.family != "generate"
            if self.opts.knee and not knee:
                doc["notes"].append(
                    "no knee sweep: a chat takes seconds, so a few seconds of open-loop "
                    "arrivals per rate hold too few of them; the figure is the saturation's"
                )
            if knee and winner.cand.processes > 1:
                knee = False  # the sweep runs in this process: it would show one share
                doc["notes"].append(
                    f"no knee sweep: the winner runs {winner.cand.processes} processes, and "
                    "the open-loop sweep drives one in-process path"
                )
            async with s._stack(winner.cand) as stack:
                await steps.activation_peak(s, stack)  # before any traffic grows it
                if knee and s.clock.fits(s.knee_cost_s(), final=True):
                    await steps.knee(s, stack, winner, rates_n=s.knee_rates)
                elif knee:
                    doc["notes"].append(
                        f"no knee sweep: it needs {s.knee_cost_s():.0f}s and "
                        f"{max(0.0, s.clock.left(final=True)):.0f}s of the budget was left"
                    )
                await steps.cost_and_memory(s, stack)
            if knee and not self.opts.quick:
                await steps.knees(s)
            await adapter_path.judge(s)
            if s.adapters:
                doc["adapters"] = {"runs": s.adapters, "quality": s.adapter_quality}
            profile = self._profile()
            doc["winner"] = winner.cand.id
            doc["profile"] = profile.to_dict()
            self._changed("done", force=True)
            stem = _stem(self.spec.id, self.cls)
            provenance = self._provenance()
            provenance["report"] = report.paths(self.report_dir, stem)["markdown"]
            file = profile_path(self.profile_dir, self.spec.id, self.cls)
            self._finish("succeeded", profile_file=str(file))
            doc["report"] = report.write(doc, self.report_dir, stem)  # first: the profile
            write_profile_file(  # last, atomically: it never points at a missing report
                self.profile_dir, self.spec.id, profile, provenance, self._header()
            )
            self._changed("done", force=True)
            return Outcome(doc, file)
        except (KeyboardInterrupt, asyncio.CancelledError):
            self._finish("cancelled", error="cancelled")
            self._changed(doc["phase"], force=True)
            raise
        except TuneError as exc:
            self._finish("failed", error=str(exc))
            self._changed(doc["phase"], force=True)
            raise
        except Exception as exc:
            self._finish("failed", error=f"{type(exc).__name__}: {exc}")
            self._changed(doc["phase"], force=True)
            raise

    def _finish(self, status: str, **fields: object) -> None:
        """The run ends: its status, and its end in wall time and in its own time."""
        elapsed = round(self.search.clock.elapsed, 1)
        self.run_doc.update(status=status, finished_at=now_iso(), elapsed_s=elapsed, **fields)

    def _profile(self) -> Profile:
        """The winner, portable across core counts: ``threads`` 0 (every core of the
        process's share) when the winner used them all, as every layout tried does."""
        s = self.search
        w = s.winner
        assert w is not None
        prof = dataclasses.replace(w.cand.profile(self.cls, s.base), threads=0)
        fit = s.cost_fit or {}
        if "fixed_ms" in fit:
            cost = CostModel(fit["fixed_ms"], fit["per_token_ms"], fit["per_padded_token_ms"])
            cap = cost.interactive_cap(prof.max_batch_tokens)
            prof = dataclasses.replace(prof, cost=cost, priority_cap=cap)
        mem = s.memory or {}
        total = int(mem.get("weights_bytes", 0)) + int(mem.get("activation_peak_bytes", 0))
        return dataclasses.replace(prof, memory_bytes=total, adapters=s.adapters)

    def _provenance(self) -> dict[str, object]:
        s = self.search
        w = s.winner
        assert w is not None
        ref = next((p for p in s.points if p.cand.engine == ("torch", "fp32") and p.samples), None)
        knee = s.knee or {}
        return {
            "written_by": "fleetserve tune",
            "fleetserve": __version__,
            "date": time.strftime("%Y-%m-%d"),
            "run": self.run_doc["id"],
            "machine": self.hw.summary(),
            "features": sorted(self.hw.features),
            "workload": f"{self.run_doc['workload']}, {self.opts.clients} clients x "
            f"{1 if self.spec.family == 'generate' else self.opts.batch} items",
            "budget_s": self.opts.budget_s,
            "elapsed_s": round(s.clock.elapsed, 1),
            "quick": self.opts.quick,  # a quick search: --tune auto refines it later
            "model_digest": self.digest,  # other weights: --tune auto tunes again
            "candidates": len(s.points),
            "noise": round(s.noise, 4),
            "figures": {
                "tokens_per_s": round(w.tokens_per_s, 1),
                "p50_ms": round(w.p50_ms, 2),
                "p99_ms": round(w.p99_ms, 2),
                "vs_torch_fp32": round(w.tokens_per_s / ref.tokens_per_s, 3) if ref else None,
                "quality": w.quality.as_dict() if w.quality else None,
                "adapter_quality": s.adapter_quality,  # the slots' gate (adapter_path)
                "knee_rps": knee.get("knee_rps"),
                "knee_tokens_s": knee.get("knee_tokens_s"),
                "cost_fit_error": (s.cost_fit or {}).get("median_rel_error"),
            },
            "memory": s.memory,
        }

    def _header(self) -> str:
        return (
            f"Written by `fleetserve tune {self.spec.id}` on {time.strftime('%Y-%m-%d')} "
            f"({self.hw.summary()}).\nDo not edit by hand: run `fleetserve tune` again."
        )


def _stem(model: str, cls: str) -> str:
    return f"{model.replace('/', '--')}.{cls}"


__all__ = ["Outcome", "Tuner"]
