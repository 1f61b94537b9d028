"""``fleetserve lora``: the adapters of a running server, over its HTTP API.

- ``lora add DIR --name NAME [--base MODEL] [--version N] [--pinned]``: upload the
  PEFT adapter in ``DIR`` (``adapter_config.json`` and ``adapter_model.safetensors``);
  prints its id (``tenant/name@version``) and sha256.
- ``lora list [--base MODEL]``: the adapters this key sees, as a table.
- ``lora rm ID``: delete ``tenant/name@N``, or every version of ``tenant/name``.

The server is ``--url``, else ``http://<host>:<port>`` from Settings; the key is
``--api-key`` (``FLEETSERVE_API_KEY``), sent as a Bearer token.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .settings import Settings
from .wire import FleetError

# the argparse dests of this command that are not Settings fields
ARGS = frozenset(
    {"lora_action", "lora_path", "lora_name", "lora_base", "lora_version", "lora_pinned"}
    | {"lora_url", "lora_id"}
)
UPLOAD_TIMEOUT = 600.0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lora = sub.add_parser("lora", help="LoRA adapters of a running server: add, list, rm.")
    actions = lora.add_subparsers(dest="lora_action", required=True)
    add = actions.add_parser("add", help="Upload a PEFT LoRA adapter directory.")
    add.add_argument("lora_path", metavar="DIR", help="adapter_config.json + safetensors.")
    add.add_argument(
        "--name", dest="lora_name", required=True, help="name or tenant/name (public/... admin)."
    )
    add.add_argument("--base", dest="lora_base", default=None, help="The base model's id.")
    add.add_argument("--version", dest="lora_version", type=int, default=None, help="[newest+1]")
    add.add_argument("--pinned", dest="lora_pinned", action="store_true", help="Keep it loaded.")
    ls = actions.add_parser("list", help="The adapters this key sees.")
    ls.add_argument("--base", dest="lora_base", default=None, help="Only this base model's.")
    rm = actions.add_parser("rm", help="Delete an adapter (no @version: every version).")
    rm.add_argument("lora_id", metavar="ID", help="tenant/name or tenant/name@version.")
    for p in (add, ls, rm):
        p.add_argument(
            "--url", dest="lora_url", default=None, help="The server [http://HOST:PORT]."
        )
        Settings.add_arguments(p)


def server_url(settings: Settings) -> str:
    host = settings.host
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{settings.port}" if ":" in host else f"http://{host}:{settings.port}"


def run(args: argparse.Namespace, settings: Settings, console: Console | None = None) -> int:
    from .sdk import Client

    console = console or Console()
    url = getattr(args, "lora_url", None) or server_url(settings)
    action = args.lora_action
    try:
        with Client(url, api_key=settings.api_key or None, max_retries=2) as client:
            if action == "add":
                info = client.upload_adapter(
                    args.lora_path,
                    args.lora_name,
                    base=args.lora_base,
                    version=args.lora_version,
                    pinned=args.lora_pinned,
                    timeout=UPLOAD_TIMEOUT,
                )
                console.print(
                    f"added {escape(info['id'])} for {escape(str(info['base']))} "
                    f"(rank {info['rank']}, sha256 {info['sha256']})",
                    highlight=False,
                )
                console.print(f"call it as model {escape(str(info['model']))}", highlight=False)
            elif action == "list":
                print_table(console, client.list_adapters(args.lora_base), url)
            else:
                for gone in client.delete_adapter(args.lora_id):
                    console.print(f"deleted {escape(gone)}", highlight=False)
    except FleetError as exc:
        console.print(f"[red]error:[/] {escape(exc.message)} ({exc.code})", highlight=False)
        return 1
    except OSError as exc:  # an adapter directory without its files
        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 1
    return 0


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "?"
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def print_table(console: Console, adapters: list[dict[str, Any]], url: str) -> None:
    """One row per adapter version, within 80 columns (long ids fold)."""
    table = Table(title=f"adapters ({url})", box=box.SIMPLE_HEAD, width=min(console.width, 80))
    table.add_column("adapter", overflow="fold", ratio=1)
    table.add_column("base", overflow="fold", ratio=1)
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("sha256", no_wrap=True)
    table.add_column("pinned", no_wrap=True)
    for a in adapters:
        table.add_row(
            escape(str(a.get("id"))),
            escape(str(a.get("base"))),
            str(a.get("rank")),
            _size(a.get("bytes")),
            str(a.get("sha256", ""))[:8],
            "yes" if a.get("pinned") else "",
        )
    console.print(table)
    if not adapters:
        console.print("[dim]no adapters[/]")
