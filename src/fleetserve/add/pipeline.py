"""``fleetserve add``'s stages in order (see the package's docstring). Each stage shows
on the console as it runs and says how long it took; the first that refuses stops the
rest, and nothing is written before the reference check has passed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ..bench.tune.options import Options, TuneError, windows
from ..bench.tune.runs import RunStore
from ..bench.tune.tuner import Tuner
from ..catalog import Catalog, ModelSpec
from ..catalog.hardware import Hardware, detect
from ..catalog.profiles import ProfileError, read_profile_file
from ..catalog.spec_yaml import render_spec
from ..gateway.model_checks import check_model_id
from ..settings import Settings
from ..wire import FleetError, InvalidInput
from ..wire.json_value import JSON
from .report import AddReport, Tuned
from .source import Refused, locate
from .spec_file import file_for, write

DEFAULT_BUDGET_S = 300.0


@dataclass(frozen=True)
class AddRequest:
    source: str
    catalog_dir: Path
    model_id: str = ""  # empty: from the source's name
    family: str = ""  # empty: inferred; the files must decide it
    budget_s: float = DEFAULT_BUDGET_S
    tune: bool = True


class Stages:
    """Times each stage and shows it: a spinner while it runs, a line when it ends."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        with self.console.status(f"{name}…"):
            yield
        self.seconds[name] = round(time.monotonic() - t0, 2)
        self.console.print(f"[green]✓[/] {name} [dim]({self.seconds[name]:.1f}s)[/]")


def add_model(req: AddRequest, settings: Settings, console: Console) -> AddReport:
    """Run every stage for ``req``; raises :class:`Refused` (nothing written past the
    stage that refused) or returns the report, its files written."""
    from ..catalog.infer import infer

    stages = Stages(console)
    t0 = time.monotonic()
    with stages.stage("find the weights"):
        located = locate(req.source, settings)
    with stages.stage("read the model's files"):
        try:
            inferred = infer(located.path, family=req.family or None)
        except (FleetError, ValueError) as exc:
            raise Refused(exc.message if isinstance(exc, FleetError) else str(exc)) from None
    model_id = req.model_id or located.default_id
    fields: dict[str, object] = {"id": model_id, "sources": [located.source]}
    fields.update(inferred.spec_fields())
    spec = _valid_spec(fields, req.catalog_dir)
    path = file_for(req.catalog_dir, spec.id)
    if path.exists():
        raise Refused(f"{path} exists: remove it, or give the model another --id")
    hw = detect(settings.device)
    cls = settings.hardware_class or hw.hardware_class
    report = AddReport(
        model=spec.id,
        source=located.source,
        path=str(located.path),
        hardware_class=cls,
        fields=_json(fields),
        evidence=dict(inferred.evidence),
        weights_bytes=_weights_bytes(located.path),
    )
    tuner = _tuner(spec, located.path, req, settings, hw, cls, console) if req.tune else None
    with stages.stage("check against the reference library"):
        report.check, report.check_markdown = _check(spec, located.path, settings, console)
    header = f"written by `fleetserve add` on {time.strftime('%Y-%m-%d')} from its own files"
    write(path, render_spec(spec.id, spec.sources, inferred, header=header))
    report.spec_file = str(path)
    if tuner is not None:
        with stages.stage(f"tune (budget {req.budget_s:.0f}s)"):
            _tune(tuner, cls, report, console)
    else:
        report.not_tuned = "--no-tune: the rules choose its engine and batch until it is tuned"
    report.seconds = {**stages.seconds, "total": round(time.monotonic() - t0, 2)}
    return report


def _valid_spec(fields: dict[str, object], catalog_dir: Path) -> ModelSpec:
    try:
        check_model_id(fields["id"])  # what POST /v1/models accepts, no more
        spec = ModelSpec.from_dict(fields)
    except InvalidInput as exc:
        raise Refused(f"--id: {exc.message}") from None
    except ValueError as exc:
        raise Refused(f"the spec for {fields['id']!r} is not valid: {exc}") from None
    dirs = (catalog_dir,) if catalog_dir.is_dir() else ()
    try:
        known = Catalog.load(dirs)
    except (ValueError, OSError) as exc:
        raise Refused(f"{catalog_dir}: {exc}") from None
    if spec.id in known:
        raise Refused(f"a model {spec.id!r} exists in the catalog: give this one another --id")
    return spec


def _check(
    spec: ModelSpec, path: Path, settings: Settings, console: Console
) -> tuple[dict[str, JSON], str]:
    """The reference check's figures; a mismatch (or a side that cannot load) refuses
    the model. With no reference library here for its family, it goes on and says so."""
    from ..bench.tune.reference import FAILED, UNCHECKED, check_reference

    result = check_reference(spec, path, settings)
    if result.status == FAILED:
        raise Refused(f"{spec.id} fails its reference check: {result.reason}", code=1)
    if result.status == UNCHECKED:
        console.print(
            f"[yellow]warning:[/] {spec.id} was not checked against a reference library: "
            f"{result.reason}",
            soft_wrap=True,
        )
    return _json(result.to_dict()), result.to_markdown()


def _tuner(
    spec: ModelSpec,
    path: Path,
    req: AddRequest,
    settings: Settings,
    hw: Hardware,
    cls: str,
    console: Console,
) -> Tuner:
    """The tune of ``spec`` (the search ``fleetserve tune`` runs), set up before
    anything is checked or written: a budget too small to measure anything, or a
    hardware class this machine is not, is bad input."""
    if cls != hw.hardware_class:
        raise Refused(
            f"this machine is {hw.hardware_class}: a profile for {cls} must be measured on "
            f"a {cls} machine (drop --hardware-class, or add with --no-tune)"
        )
    tune_dir = Path(settings.tune_dir).expanduser()
    measure_s, knee_s = windows(req.budget_s)
    opts = Options(
        budget_s=req.budget_s,
        measure_s=measure_s,
        knee_s=knee_s,
        device=settings.device if settings.device != "auto" else hw.kind,
        cache_dir=Path(settings.cache_dir).expanduser(),
    )
    try:
        return Tuner(
            spec,
            path,
            hw,
            cls,
            opts,
            RunStore(tune_dir),
            profile_dir=Path(settings.profile_dir).expanduser(),
            report_dir=tune_dir / "reports",
            catalog_dirs=(req.catalog_dir,),
            console=console,
        )
    except TuneError as exc:
        raise Refused(str(exc)) from None


def _tune(tuner: Tuner, cls: str, report: AddReport, console: Console) -> None:
    """Run the tune; what it found goes into ``report`` (a failed tune: why not)."""
    try:
        outcome = asyncio.run(tuner.run())
    except (TuneError, FleetError, RuntimeError, OSError) as exc:
        text = exc.message if isinstance(exc, FleetError) else str(exc)
        report.not_tuned = f"the tune failed: {text}; the rules choose until it is tuned"
        console.print(f"[yellow]warning:[/] {report.not_tuned}", soft_wrap=True)
        return
    run = outcome.run
    cands = {c["id"]: c for c in run.get("candidates", [])}
    won = cands.get(run.get("winner") or "")
    ref = next(
        (c for c in cands.values() if (c.get("runtime"), c.get("precision")) == ("torch", "fp32")),
        None,
    )
    if won is None or outcome.profile_file is None:
        report.not_tuned = "the tune found no winner; the rules choose until it is tuned"
        return
    report.tuned = Tuned(
        winner=str(won["id"]),
        tokens_per_s=float(won.get("tokens_per_s") or 0.0),
        torch_fp32_tokens_per_s=(
            float(ref["tokens_per_s"]) if ref and ref.get("tokens_per_s") else None
        ),
        profile_file=str(outcome.profile_file),
        tune_report=str((run.get("report") or {}).get("markdown", "")),
    )
    try:  # the footprint it measured: weights and the activation peak of a full batch
        profile = read_profile_file(outcome.profile_file, cls).profile
        report.resident_bytes = profile.memory_bytes or None
    except ProfileError as exc:
        console.print(f"[yellow]warning:[/] {exc}", soft_wrap=True)


def _weights_bytes(path: Path) -> int:
    files = [*path.glob("*.safetensors"), *path.glob("pytorch_model*.bin")]
    return sum(f.stat().st_size for f in files)


def _json(value: object) -> dict[str, JSON]:
    """``value`` (a mapping of plain data) as a typed JSON object."""
    out: dict[str, JSON] = json.loads(json.dumps(value))
    return out
