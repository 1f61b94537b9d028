"""The ``fleetserve`` command line. Settings are read here, once, and passed down."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Coroutine, Sequence

from rich.console import Console
from rich.markup import escape

from .cli_groups import add_settings
from .settings import Settings
from .wire import FleetError


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, usage: str
) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=help,
        description=help,
        usage=f"fleetserve {name} {usage}".rstrip(),
        formatter_class=_Formatter,
    )


class _Formatter(argparse.HelpFormatter):
    """Help that reads at 80 columns: flags on their own line, help below them."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=28)


def _parser(show_all: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetserve", description="Serve fleets of small models.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = _command(
        sub, "serve", "Gateway, in-process queue and a worker in one process.", "[options]"
    )
    add_settings(serve, "serve", show_all)
    gateway = _command(
        sub, "gateway", "The HTTP API in front of NATS (--nats URL).", "--nats URL [options]"
    )
    add_settings(gateway, "gateway", show_all)
    worker = _command(
        sub,
        "worker",
        "Serve models from NATS (--nats URL [--devices …]).",
        "--nats URL [--models …] [--devices …] [options]",
    )
    add_settings(worker, "worker", show_all)
    cluster = _command(
        sub,
        "cluster",
        "Local nats-server, one gateway and N workers, for trying it out.",
        "[--workers N] [options]",
    )
    cluster.add_argument("--workers", type=int, default=2, help="Worker processes [2].")
    cluster.add_argument("--store-dir", default=None, help="JetStream store (default: temp).")
    add_settings(cluster, "cluster", show_all)
    dlq = _command(
        sub,
        "dlq",
        "The dead-letter stream: list, replay or purge.",
        "{list,replay,purge} [--seq N] [--limit N] [options]",
    )
    dlq.add_argument("action", choices=["list", "replay", "purge"])
    dlq.add_argument("--seq", type=int, action="append", help="Only these entries (replay).")
    dlq.add_argument("--limit", type=int, default=100, help="Entries to list [100].")
    add_settings(dlq, "dlq", show_all)
    from .cli_keys import add_parser as keys_parser

    keys_parser(sub)
    from .cli_lora import add_parser as lora_parser

    lora_parser(sub)
    models = _command(
        sub,
        "models",
        "List the catalog; prepare models (convert, fetch, export) ahead of serving; release "
        "a model's keep-alive on the running server.",
        "[list | prepare MODEL … | release MODEL …] [options]",
    )
    models.add_argument("action", nargs="?", default="list", choices=["list", "prepare", "release"])
    models.add_argument(
        "ids", nargs="*", metavar="MODEL", help="Models to prepare, or to release (admin key)."
    )
    models.add_argument(
        "--json", dest="models_json", action="store_true", help="List as JSON (piped: TSV)."
    )
    models.add_argument(
        "--runtime",
        dest="prepare_runtime",
        default="",
        metavar="RUNTIME",
        help="Prepare for this runtime: onnx, openvino or torch (default: its profile's).",
    )
    models.add_argument(
        "--precision",
        dest="prepare_precision",
        default="",
        metavar="PRECISION",
        help="Precision, e.g. int8 (onnx) or bf16 (openvino; default: its profile's).",
    )
    add_settings(models, "models", show_all)
    tune = _command(
        sub,
        "tune",
        "Tune models for this machine: runtimes, precisions and batch budgets behind "
        "quality gates; writes a profile and a report.",
        "MODEL … [options]",
    )
    from .bench.tune.cli import add_arguments as tune_arguments

    tune_arguments(tune)
    add_settings(tune, "tune", show_all)
    add = _command(
        sub,
        "add",
        "Add a model in one step: its family from its own files, checked against its "
        "reference library, tuned; writes its spec and a report.",
        "SOURCE [--id ID] [--family F] [--no-tune] [options]",
    )
    from .cli_add import add_arguments as add_add_arguments

    add_add_arguments(add)
    add_settings(add, "add", show_all)
    hardware = _command(
        sub,
        "hardware",
        "This machine's hardware class, the facts behind it, its profiles.",
        "[options]",
    )
    add_settings(hardware, "hardware", show_all)
    sub.add_parser(
        "bench",
        help="Benchmarks: the open-loop knee of embeddings servers, the queue simulator, "
        "the cost fit (fleetserve bench [knee|sim|cost] --help).",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # the bench has its own flags
        from .bench import main as bench_main

        return bench_main(argv[1:])
    args = _parser(show_all="--help-all" in argv).parse_args(argv)
    console = Console(stderr=True)
    extra = {"command", "workers", "store_dir", "action", "seq", "limit", "ids"}
    extra |= {"prepare_runtime", "prepare_precision", "models_json"}
    from .bench.tune.cli import ARGS as TUNE_ARGS

    extra |= TUNE_ARGS
    from .cli_keys import ARGS as KEYS_ARGS

    extra |= KEYS_ARGS
    from .cli_lora import ARGS as LORA_ARGS

    extra |= LORA_ARGS
    from .cli_add import ARGS as ADD_ARGS

    extra |= ADD_ARGS
    cli = {k: v for k, v in vars(args).items() if k not in extra}
    try:
        settings = Settings.load(env=os.environ, cli=cli)
    except (ValueError, OSError) as exc:
        _error(console, exc)
        return 2
    from .logs import setup_logging

    try:
        setup_logging(settings, tag=_tag(args.command, settings))
    except ValueError as exc:
        _error(console, exc)
        return 2
    if args.command in ("tune", "hardware", "models"):
        try:
            return _catalog_command(settings, args, console)
        except (ValueError, OSError, FleetError) as exc:  # a broken profile file, say
            _error(console, exc)
            return 1
    if args.command == "add":
        from .cli_add import run as run_add

        return run_add(settings, args, console)
    if args.command == "keys":
        from .cli_keys import run as run_keys

        try:
            return run_keys(args, settings)
        except (ValueError, OSError) as exc:
            _error(console, exc)
            return 1
    if args.command == "lora":
        from .cli_lora import run as run_lora

        return run_lora(args, settings)
    if args.command == "cluster":
        from .cluster.supervisor import run_cluster
        from .gateway.auth import Authenticator

        try:
            Authenticator.from_settings(settings)  # a bad key setting fails before any process
            return run_cluster(settings, args.workers, os.environ, args.store_dir)
        except (ValueError, OSError, FleetError) as exc:
            _error(console, exc)
            return 1
    if args.command == "dlq":
        from .queue.dlq_cli import run_dlq

        return _run(run_dlq(settings, args.action, args.seq, args.limit), console)
    if args.command == "gateway":
        from .gateway.process import run_gateway

        return _run(run_gateway(settings), console)
    if args.command == "worker":
        from .worker.process import run_worker

        return _run(run_worker(settings, os.environ), console)
    from .server import serve

    return _run(serve(settings, os.environ), console)


def _tag(command: str, settings: Settings) -> str:
    """The process name on each log line where several share a terminal: a worker's
    id (``fleetserve cluster`` names its workers ``worker-0``...)."""
    return settings.worker_id if command == "worker" else ""


def _error(console: Console, exc: BaseException) -> None:
    """A start-up failure (a bad catalog file, a missing directory) on stderr as
    ``error: <message>``, taken literally (no markup, no wrapping) and no traceback."""
    console.print(f"[red]error:[/] {escape(str(exc) or type(exc).__name__)}", soft_wrap=True)


def _catalog_command(settings: Settings, args: argparse.Namespace, console: Console) -> int:
    if args.command == "tune":
        from .bench.tune.cli import run_tune

        return run_tune(settings, args, console)
    if args.command == "hardware":
        from .bench.tune.cli import run_hardware

        return run_hardware(settings, Console())  # the answer goes to stdout
    from .cli_models import list_models, prepare_models, release_models

    if args.action == "release":
        return release_models(settings, args.ids, console)
    if args.action == "prepare":
        return prepare_models(
            settings, args.ids, args.prepare_runtime, args.prepare_precision, console
        )
    return list_models(settings, as_json=args.models_json)


async def _until_signal(main: Coroutine[object, None, int | None]) -> int | None:
    """Ctrl-C and SIGTERM cancel ``main``, so its ``finally`` blocks stop it cleanly."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stopping = False

    def stop() -> None:  # once: a second signal (uvicorn re-raises the one it caught)
        nonlocal stopping  # must not cut the clean-up in ``finally`` blocks short
        if not stopping:
            stopping = True
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        return await main
    except asyncio.CancelledError:
        return 0


def _run(main: Coroutine[object, None, int | None], console: Console) -> int:
    import uvloop

    try:
        result = uvloop.run(_until_signal(main))
    except KeyboardInterrupt:
        return 0
    except (FleetError, ValueError, OSError, RuntimeError) as exc:
        _error(console, exc)
        return 1
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
