"""``fleetserve add SOURCE``: find the family in the model's own files, check the served
replies against the model's reference library, write the spec, tune it, and report
(``fleetserve.add``). Exit 2 for bad input (nothing written), 1 for a model that fails
its reference check (nothing written), 0 once the spec is written."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .add.pipeline import DEFAULT_BUDGET_S, AddRequest, add_model
from .add.source import Refused
from .sdk import Client
from .settings import Settings
from .wire import Conflict, FleetError
from .yamlio import load_yaml

DEFAULT_CATALOG = "~/.config/fleetserve/catalog"
ARGS = {"add_source", "add_id", "add_family", "add_budget", "no_tune", "add_server"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "add_source",
        metavar="SOURCE",
        help="The model: a local directory, hf:org/name (the HF cache) or s3://bucket/prefix.",
    )
    p.add_argument(
        "--id", dest="add_id", default="", metavar="ID", help="Its model id [from SOURCE's name]."
    )
    p.add_argument(
        "--family",
        dest="add_family",
        default="",
        metavar="FAMILY",
        help="The family, where the model's files do not decide it [inferred].",
    )
    p.add_argument(
        "--budget",
        dest="add_budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        metavar="S",
        help=f"Seconds for its tune [{DEFAULT_BUDGET_S:.0f}].",
    )
    p.add_argument("--no-tune", action="store_true", help="Write the spec without tuning it.")
    p.add_argument(
        "--server",
        dest="add_server",
        default="",
        metavar="URL",
        help="Also make it servable on this running server, without a restart (an admin key).",
    )


def run(settings: Settings, args: argparse.Namespace, console: Console) -> int:
    catalog = Path(settings.catalog or DEFAULT_CATALOG).expanduser()
    req = AddRequest(
        source=args.add_source,
        catalog_dir=catalog,
        model_id=args.add_id,
        family=args.add_family,
        budget_s=args.add_budget,
        tune=not args.no_tune,
    )
    try:
        report = add_model(req, settings, console)
    except Refused as exc:
        console.print(f"[red]error:[/] {escape(exc.message)}", soft_wrap=True)
        return exc.code
    md, js = report.write(Path(settings.tune_dir).expanduser() / "reports")
    out = Console()
    family = report.fields.get("family")
    out.print(f"[green]added[/] {escape(report.model)} ({family}) -> {report.spec_file}")
    if report.tuned is not None:
        t = report.tuned
        ratio = f", {t.vs_torch_fp32:.2f}x torch fp32" if t.vs_torch_fp32 else ""
        out.print(f"  tuned: {escape(t.winner)} at {t.tokens_per_s:,.0f} tokens/s{ratio}")
    else:
        out.print(f"  not tuned: {escape(report.not_tuned)}")
    out.print(f"  report: {md} (and {js.name})")
    if args.add_server:
        return _on_server(args.add_server, Path(report.spec_file), settings, out, console)
    if not settings.catalog:
        out.print(f"  serve it: fleetserve serve --catalog {catalog}")
    return 0


def _on_server(url: str, spec_file: Path, settings: Settings, out: Console, errors: Console) -> int:
    """Serve the written spec on the server at ``url`` now (``POST /v1/models``, an
    admin key). A server that watches the catalog directory may have taken it already."""
    spec = load_yaml(spec_file.read_text(encoding="utf-8"))
    try:
        with Client(url, api_key=settings.api_key or None, max_retries=0) as client:
            entry = client.add_model(spec, timeout=120.0)
    except Conflict:
        out.print(f"  {escape(url)} serves it already (it watches the catalog directory)")
        return 0
    except FleetError as exc:
        errors.print(
            f"[red]error:[/] {escape(url)} did not take it: {escape(exc.message)} (the spec "
            f"is written: {spec_file})",
            soft_wrap=True,
        )
        return 1
    out.print(f"  serving on {escape(url)}: {escape(str(entry.get('id')))}")
    return 0
