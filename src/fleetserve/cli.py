"""The ``fleetserve`` command line. Settings are read here, once, and passed down."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from .settings import Settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetserve", description="Serve fleets of small models.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Gateway, in-process queue and a worker in one process.")
    Settings.add_arguments(serve)
    models = sub.add_parser("models", help="List the model catalog.")
    Settings.add_arguments(models)
    sub.add_parser(
        "bench",
        help="Benchmark fleetserve against in-process and peers (fleetserve bench [embed|http] "
        "--help).",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # the bench has its own flags
        from .bench import main as bench_main

        return bench_main(argv[1:])
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    cli = {k: v for k, v in vars(args).items() if k != "command"}
    try:
        settings = Settings.load(env=os.environ, cli=cli)
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    if args.command == "models":
        return _models(settings)
    return _serve(settings, console)


def _serve(settings: Settings, console: Console) -> int:
    from .server import serve

    try:
        import uvloop

        uvloop.run(serve(settings))
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        console.print(f"[red]error:[/] {exc}")
        return 1
    return 0


def _models(settings: Settings) -> int:
    from .catalog.sources import is_present
    from .server import HF_CACHE, build_catalog

    catalog = build_catalog(settings)
    table = Table(title="fleetserve catalog")
    table.add_column("model", no_wrap=True)
    for col in ("family", "runtime", "pooling", "max_seq_len", "dims", "present"):
        table.add_column(col)
    for s in catalog:
        present = "yes" if is_present(s.sources, HF_CACHE) else "no"
        table.add_row(
            s.id,
            s.family,
            s.runtime,
            s.pooling,
            str(s.max_seq_len),
            str(s.dimensions or "?"),
            present,
        )
    Console().print(table)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
