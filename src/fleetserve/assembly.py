"""Assembly: the catalog, the profiles and the runners that every fleetserve process
(embedded server, worker, device process, tuner, bench) builds from its settings."""

from __future__ import annotations

import fnmatch
import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console

from .bench.tune.activation import measure_activation_peak
from .catalog import Catalog, ModelSpec, facts
from .catalog.hardware import detect
from .catalog.profiles import Choice, Profiles
from .catalog.rules import install_hint, missing_extra, missing_extras
from .catalog.sources import locate
from .catalog.weights import local_weights, weights_path
from .families import AnyFamily, create_family
from .fleet.host_share import HostShare
from .fleet.manager import Fleet
from .fleet.memory import (
    OFF,
    actual_bytes,
    budget_limit,
    default_budget,
    mib,
    parse_limit,
    parse_size,
    trim,
)
from .fleet.policy import make_policy
from .lora.bases import IN_GRAPH, SLOT_RUNTIMES
from .metrics import Metrics
from .runtimes import create_runtime
from .runtimes.cache import weights_fingerprint
from .settings import Settings
from .wire import FleetError
from .worker import ModelRunner
from .worker.estimate import KeptWeights
from .worker.gen_runner import GenerationRunner
from .worker.runner import Runner

log = logging.getLogger("fleetserve")
plog = logging.getLogger("fleetserve.profiles")
SHORT_LIST = 3  # models at start listed one line each; more: a summary (each at debug)
LOAD_TIMEOUT = 3600.0  # a pinned model's load at start (a first GGUF conversion is slow)
HF_CACHE = Path("~/.cache/huggingface/hub").expanduser()  # Settings.hf_cache's default


def build_catalog(settings: Settings) -> Catalog:
    """The bundled catalog and ``--catalog``, restricted to ``--models``: ids (loaded
    at start) or patterns such as ``org/*`` (served, loaded on first use). Specs whose
    weights are in this machine's caches get what they leave out from the model's own
    files (``catalog/complete.py``)."""
    extra = [Path(settings.catalog)] if settings.catalog else []
    catalog = Catalog.load(extra, weights=local_weights(settings))
    ids: list[str] = []
    for want in settings.model_list():
        if not any(c in want for c in "*?["):
            ids.append(want)
            continue
        matched = [s.id for s in catalog if fnmatch.fnmatchcase(s.id, want)]
        if not matched:
            raise ValueError(f"--models {want!r} matches no model in the catalog")
        ids += matched
    return catalog.restrict(dict.fromkeys(ids)) if ids else catalog


def build_profiles(settings: Settings) -> Profiles:
    """This machine's profiles: its hardware class (or the one asked for), the tuned
    files for it (yours, then bundled), its fallbacks. A broken file is a ValueError
    naming the file and the field."""
    return Profiles(
        detect(_device(settings)),
        settings.hardware_class,
        Path(settings.profile_dir),
        unbundled=not settings.bundled_profiles,
    )


def _device(settings: Settings) -> str:
    return "cpu" if settings.device.startswith("cpu") else settings.device


@functools.lru_cache(maxsize=4)
def hardware_class(device: str, asked: str = "") -> str:
    """The class ``device`` is in (``asked``: the one Settings name), found once."""
    return asked or detect(device).hardware_class


def gated(spec: ModelSpec, choice: Choice) -> bool:
    """Whether ``spec``'s loads are held to the quality gate: a rule's precision below
    fp32 (its fp32 reference runs on torch where torch is installed)."""
    p = choice.profile
    return choice.how == "rule" and p.precision != "fp32" and spec.runtime != "external"


def load_runtimes(spec: ModelSpec, choice: Choice) -> frozenset[str]:
    """The runtimes ``spec``'s loads use: the profile's, and torch for the gate."""
    served = choice.profile.runtime or spec.runtime
    return frozenset({served, "torch"} if gated(spec, choice) else {served})


def build_runner(
    spec: ModelSpec, settings: Settings, metrics: Metrics, choice: Choice | None = None
) -> Runner:
    """A runner for ``spec``. Nothing is resolved or loaded here: the weights are found
    and loaded on first use (at start for pinned models and those named in --models).
    A profile chosen by rules is held to the quality gate when it loads."""
    choice = choice or build_profiles(settings).choose(spec)
    profile = choice.profile
    # where adapters run, as the tune of this class found ("": judged here, at load)
    verdict = profile.adapters if choice.how == "tuned" else ""
    in_graph = spec.family in IN_GRAPH and settings.lora_in_graph and verdict != "torch"

    def make_family(
        precision: str = profile.precision, runtime: str = profile.runtime or spec.runtime
    ) -> AnyFamily:
        path = weights_path(spec, settings)
        engine = create_runtime(
            runtime,
            device=settings.device,
            precision=precision,
            threads=settings.torch_threads or profile.threads,
            cache_dir=Path(settings.cache_dir).expanduser(),
            options=spec.runtime_options,
            adapter_slots=settings.max_adapters_per_batch if in_graph else 0,
            max_rank=settings.max_adapter_rank,
        )
        return create_family(spec, engine, path)

    def make_reference() -> AnyFamily:  # fp32 torch, or this runtime where it is absent
        return make_family("fp32", "torch" if not missing_extra("torch") else runtime_name)

    runtime_name = profile.runtime or spec.runtime
    cache_dir = Path(settings.cache_dir).expanduser()

    def engine(runtime: str) -> str:  # what a fact kept on disk depends on besides weights
        cls = hardware_class(_device(settings), settings.hardware_class)
        return f"{runtime}\0{cls}\0{facts.library_version(runtime)}"

    def fingerprint() -> bytes:  # a pass holds for the same weights, engine and CPU
        path = weights_path(spec, settings)
        return weights_fingerprint(path) + f"\0{engine(runtime_name)}".encode()

    verify = None
    if gated(spec, choice):
        from .bench.tune.gate import gate_at_load
        from .bench.tune.verdicts import Verdicts

        verdicts = Verdicts(cache_dir / "gate")
        verify = gate_at_load(spec, profile.precision, make_reference, fingerprint, verdicts)
    eager = spec.pinned or spec.id in settings.model_list()
    tokens = settings.max_batch_tokens or profile.max_batch_tokens

    peaks: dict[str, int] = {}
    kept = facts.Facts(cache_dir / "peak", "activation peaks")

    def measure(adapter: AnyFamily) -> int:  # the activation peak of a full batch
        """Measured once per engine and weights, and kept on disk (``<cache_dir>/peak``):
        a reload after an eviction measures nothing, nor does the next process (new
        weights at the same path are measured again)."""
        path = weights_path(spec, settings)
        rt = adapter.runtime
        try:
            key = facts.fact_key(
                spec.id, spec.family, str(spec.max_seq_len), rt.precision, str(tokens),
                str(profile.max_batch_size), engine(rt.name), weights_fingerprint(path),
            )  # fmt: skip
        except OSError:  # no config.json to key on: measured at every load
            return measure_activation_peak(adapter, spec, path, tokens, profile.max_batch_size)
        if key not in peaks:
            found = kept.get(key)
            peak = found.get("bytes") if found is not None else None
            if not isinstance(peak, int) or peak <= 0:
                peak = measure_activation_peak(adapter, spec, path, tokens, profile.max_batch_size)
                if peak > 0:  # 0: not measured
                    kept.put(key, {"model": spec.id, "bytes": peak})
            peaks[key] = peak
        return peaks[key]

    def found() -> Path | None:  # the weights on disk, where they are
        return locate(spec.sources, Path(settings.hf_cache).expanduser(), cache_dir)

    def held_key() -> str | None:  # what the weights hold depends on besides themselves
        path = found()
        try:
            fingerprint = weights_fingerprint(path) if path is not None else None
        except OSError:  # no config.json to key on
            fingerprint = None
        if fingerprint is None:  # (not there yet: fetched at its load) none kept
            return None
        return facts.fact_key(spec.id, spec.family, runtime_name, profile.precision,
                              engine(runtime_name), fingerprint)  # fmt: skip

    held = facts.Facts(cache_dir / "held", "weights as loaded")
    estimate = KeptWeights(held, held_key, found, profile.precision, spec.id)

    runner: ModelRunner | GenerationRunner
    if spec.family == "generate":
        runner = GenerationRunner(
            spec, profile, make_family, metrics, settings.max_batch_tokens,
            eager=eager, verify=verify, measure=measure, estimate=estimate,
            max_adapters=settings.max_adapters_per_batch,
        )  # fmt: skip
    else:
        runner = ModelRunner(
            spec, profile, make_family, metrics, settings.max_batch_tokens,
            eager=eager, verify=verify, measure=measure, estimate=estimate,
            max_adapters=settings.max_adapters_per_batch,
            may_sleep=settings.host_tier.strip().lower() not in OFF,
            interactive_tokens=interactive_tokens(choice, settings),
            hold=settings.interactive_hold, age_limit=settings.batch_age_limit,
        )  # fmt: skip
    if not missing_extra("torch"):
        # adapters run on torch: at the profile's precision where torch has it
        torch_precision = profile.precision if profile.precision != "int8" else "fp32"
        runner.adapters.torch_factory = lambda: make_family(torch_precision, "torch")
        if runtime_name in SLOT_RUNTIMES and in_graph and verdict != "in_graph":
            from .bench.tune.slot_gate import SlotGate
            from .bench.tune.verdicts import Verdicts

            runner.adapters.slot_gate = SlotGate(
                spec, profile.precision, lambda: make_family("fp32", "torch"), fingerprint,
                Verdicts(cache_dir / "gate"),
            )  # fmt: skip
    return runner


def interactive_tokens(choice: Choice, settings: Settings) -> int:
    """The batch cap while queries wait (``Choice.interactive_batch_tokens``), for the
    threads this process runs with: a profile tuned on every core predicts a batch on
    half of them to take twice as long, so the cap that keeps it ~25 ms is halved."""
    cap = choice.interactive_batch_tokens
    cores = os.cpu_count() or 1
    tuned = choice.profile.threads or cores
    running = settings.torch_threads or choice.profile.threads or cores
    if running < tuned:
        cap = max(64, cap * running // tuned // 64 * 64)
    return cap


TIER_FORMS = "bytes, a size (2GiB), a percent of --memory-budget (100%, 400%) or 0/off"


def host_tier_bytes(text: str, budget: int) -> int:
    """``--host-tier``: bytes, a size, or a percent of the memory budget (above 100 %
    too: the page cache may hold more than the process); 0 for ``OFF``."""
    raw = text.strip()
    if raw.endswith("%") and raw.lower() not in OFF:
        try:
            pct = float(raw[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct < float("inf"):
            raise ValueError(f"--host-tier: cannot use {raw!r}; give {TIER_FORMS}")
        return int(pct / 100 * budget)
    return parse_limit(raw, "--host-tier", limit=budget, forms=TIER_FORMS)


def build_fleet(
    settings: Settings, runners: Mapping[str, Runner], metrics: Metrics, console: Console
) -> Fleet:
    """The device's fleet: its memory budget (``--memory-budget``, or the default
    fraction of what this process may use), the eviction policy, its models. Pinned
    models that cannot fit are a one-line ValueError."""
    device = "cpu" if settings.device in ("auto", "") else settings.device
    default, why = default_budget(device)
    budget = parse_size(settings.memory_budget, limit=budget_limit(device)) or default
    share = None
    if not settings.memory_budget and not device.startswith("cuda"):  # the host's memory
        where = Path(settings.memory_share_dir) if settings.memory_share_dir else None
        share = HostShare(budget, where)
        budget = share.budget()
    fleet = Fleet(
        budget,
        make_policy(settings.eviction),
        metrics=metrics,
        cooldown=settings.load_retry_after,
        room_wait=settings.room_wait,
        trim=trim,
        budget_now=share.budget if share is not None else None,
        actual=actual_bytes(device),
        host_budget=host_tier_bytes(settings.host_tier, budget),
    )
    for r in runners.values():
        fleet.add(r)
    if share is not None and share.parts() > 1:
        why += f", split {share.parts()} ways with the other fleetserve processes on this host"
    fleet.check_budget()
    how = f"--memory-budget {settings.memory_budget}" if settings.memory_budget else why
    tier = "no host tier"
    if fleet.room.host.budget:
        tier = f"a host tier of {mib(fleet.room.host.budget)} for sleeping models"
    logging.getLogger("fleetserve.fleet").info(
        "memory budget %s (%s); %s; evicting by %s", mib(fleet.budget), how, tier, settings.eviction
    )
    return fleet


def log_choices(choices: dict[str, Choice], catalog: Catalog, console: Console) -> None:
    """What each model runs with and why: one line per model when there are few
    (``SHORT_LIST``), else one summary line and each model's at debug level (``GET
    /v1/models`` has the whole reason). ``console`` is unused: it all goes to the log."""
    specs = list(catalog)
    ruled = 0
    each = logging.INFO if len(specs) <= SHORT_LIST else logging.DEBUG
    for spec in specs:
        c = choices[spec.id]
        p = c.profile
        why = c.reason.split("; `fleetserve tune", 1)[0]
        ruled += c.how in ("rule", "fallback")
        procs = (
            f"; its profile asks for {p.processes} processes per device, which "
            "`fleetserve worker` runs (this process is one)"
            if p.processes > 1
            else ""
        )
        plog.log(
            each,
            "%s: %s %s, batch %d/%d (%s%s)",
            spec.id, p.runtime or spec.runtime, p.precision, p.max_batch_size,
            p.max_batch_tokens, why, procs,
        )  # fmt: skip
    hint = "; `fleetserve tune MODEL` tunes them" if ruled else ""
    plog.info("%d tuned, %d on rules or a fallback%s", len(specs) - ruled, ruled, hint)
    log_missing_extras(choices, specs)


def log_missing_extras(choices: dict[str, Choice], specs: list[ModelSpec]) -> None:
    """One warning per extra that models of the catalog need and this install lacks:
    which models, and the command that installs it (those models answer 503 till then)."""
    lacking: dict[str, list[str]] = {}
    for spec in specs:
        runtime = choices[spec.id].profile.runtime or spec.runtime
        for extra in missing_extras(spec, runtime):
            lacking.setdefault(extra, []).append(spec.id)
    for extra, ids in lacking.items():
        named = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        logging.getLogger("fleetserve.profiles").warning(
            "%d %s need fleetserve[%s], not installed: %s; %s",
            len(ids), "model" if len(ids) == 1 else "models", extra, named, install_hint(extra),
        )  # fmt: skip


async def load_or_report(fleet: Fleet, runner: Runner, console: Console) -> bool:
    """Load a pinned model at start, through the fleet so that its bytes count. One
    that fails (weights absent, an extra not installed) is reported and left to load
    on first use after the cool-down: the others still serve."""
    try:
        await fleet.acquire(runner.model_id, timeout=LOAD_TIMEOUT)
        fleet.release(runner.model_id)
    except Exception as exc:
        message = exc.message if isinstance(exc, FleetError) else f"{type(exc).__name__}: {exc}"
        log.error(
            "%s failed to load: %s; serving the other models, and its requests will try again",
            runner.spec.id,
            message,
        )
        runner.eager = False  # not required for readiness any more
        return False
    return True
