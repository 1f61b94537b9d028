"""``fleetserve lora``: the adapters of a running server, over its HTTP API.

- ``lora add DIR --name NAME [--base MODEL] [--version N] [--pinned]``: upload the
  PEFT adapter in ``DIR`` (``adapter_config.json`` and ``adapter_model.safetensors``);
  prints its id (``tenant/name@version``) and sha256.
- ``lora list [--base MODEL]``: the adapters this key sees, as a table.
- ``lora rm ID``: delete ``tenant/name@N``, or every version of ``tenant/name``.
- ``lora train --model M --pairs FILE [--eval FILE] [--suffix S] [--rank N]
  [--alpha A] [--epochs N] [--learning-rate LR] [--batch-size N] [--margin X]
  [--detach]``: a fine-tuning job (``/v1/files``, ``/v1/fine_tuning/jobs``): uploads
  the JSONL of ``{query, positive, negative?}`` pairs, creates the job and follows
  it (a progress bar over the training steps, the other events as lines), then
  prints base against adapter (nDCG@10, recall@10), whether it was registered and
  the model name to call. Exit 0 when the job succeeded, 1 when it failed or was
  cancelled; Ctrl-C cancels the job (exit 130). ``--detach``: create it and return.

The server is ``--url``, else ``http://<host>:<port>`` from Settings; the key is
``--api-key`` (``FLEETSERVE_API_KEY``), sent as a Bearer token.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .cli_groups import add_settings
from .settings import Settings
from .wire import FleetError

if TYPE_CHECKING:
    from .sdk import Client
    from .sdk.records import AdapterInfo, FileObject, FineTuningEvent, FineTuningJob
    from .wire.json_value import JSON, JSONObject

# the argparse dests of this command that are not Settings fields
ARGS = frozenset(
    {"lora_action", "lora_path", "lora_name", "lora_base", "lora_version", "lora_pinned"}
    | {"lora_url", "lora_id", "lora_model", "lora_pairs", "lora_eval", "lora_suffix"}
    | {"lora_rank", "lora_alpha", "lora_epochs", "lora_lr", "lora_batch", "lora_margin"}
    | {"lora_detach", "lora_truncate"}
)
UPLOAD_TIMEOUT = 600.0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lora = sub.add_parser("lora", help="LoRA adapters of a running server: add, list, rm, train.")
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
    for p in (add, ls, rm, train_parser(actions)):
        p.add_argument(
            "--url", dest="lora_url", default=None, help="The server [http://HOST:PORT]."
        )
        add_settings(p, "lora")


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
            elif action == "train":
                return train(client, args, console)
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


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "?"
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def print_table(console: Console, adapters: list[AdapterInfo], url: str) -> None:
    """One row per adapter version, within the terminal's width (ids fold only where
    they must); piped, tab-separated columns, nothing folded."""
    if not console.is_terminal:
        rows = [["adapter", "base", "rank", "bytes", "sha256", "pinned"]]
        rows += [
            [str(a.get("id")), str(a.get("base")), str(a.get("rank")), str(a.get("bytes")),
             str(a.get("sha256", "")), "yes" if a.get("pinned") else ""]
            for a in adapters
        ]  # fmt: skip
        console.file.write("".join("\t".join(r) + "\n" for r in rows))
        return
    table = Table(title=f"adapters ({url})", box=box.SIMPLE_HEAD)
    table.add_column("adapter", overflow="fold")
    table.add_column("base", overflow="fold")
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


# -- lora train: a fine-tuning job, followed --------------------------------------------
POLL = 0.5  # seconds between looks at a job being followed
SHORT = {"learning_rate": "lr", "batch_size": "batch", "hard_negatives": "hard negatives"}


def train_parser(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    tr = actions.add_parser(
        "train", help="Fine-tune a LoRA on pairs: upload, train, measure, register."
    )
    tr.add_argument(
        "--model", dest="lora_model", required=True, metavar="M", help="The base model's id."
    )
    tr.add_argument(
        "--pairs", dest="lora_pairs", required=True, metavar="FILE",
        help="JSONL of {query, positive, negative?} rows.",
    )  # fmt: skip
    tr.add_argument(
        "--eval", dest="lora_eval", default=None, metavar="FILE",
        help="Pairs to measure with [a held-out fraction of the queries of --pairs].",
    )  # fmt: skip
    tr.add_argument(
        "--suffix", dest="lora_suffix", default=None, metavar="S", help="The adapter's name."
    )
    tr.add_argument(
        "--rank", dest="lora_rank", type=int, default=None, metavar="N", help="LoRA rank [16]."
    )
    tr.add_argument(
        "--alpha", dest="lora_alpha", type=float, default=None, metavar="A", help="[2 * rank]"
    )
    tr.add_argument("--epochs", dest="lora_epochs", type=int, default=None, metavar="N", help="[3]")
    tr.add_argument(
        "--learning-rate", dest="lora_lr", type=float, default=None, metavar="LR", help="[1e-3]"
    )
    tr.add_argument(
        "--batch-size", dest="lora_batch", type=int, default=None, metavar="N", help="[32]"
    )
    tr.add_argument(
        "--margin", dest="lora_margin", type=float, default=None, metavar="X",
        help="nDCG@10 gain over the base needed to register it [the server's].",
    )  # fmt: skip
    tr.add_argument(
        "--detach", dest="lora_detach", action="store_true", help="Create the job and return."
    )
    tr.add_argument(
        "--truncate", dest="lora_truncate", action="store_true",
        help="Cut texts over the server's --train-max-chars instead of refusing the file.",
    )  # fmt: skip
    return tr


def train(client: Client, args: argparse.Namespace, console: Console) -> int:
    """Upload, create, follow, report: 0 when the job succeeded, 1 when it did not,
    130 on Ctrl-C (which cancels the job once it exists)."""
    try:
        job = _create(client, args, console)
    except KeyboardInterrupt:
        _line(console, "interrupted before a job was followed (see GET /v1/fine_tuning/jobs)")
        return 130
    if args.lora_detach:
        _line(console, f"detached: see GET /v1/fine_tuning/jobs/{job['id']}")
        return 0
    try:
        job = follow(client, job["id"], console)
    except KeyboardInterrupt:
        try:
            job = client.cancel_fine_tuning_job(job["id"])
            _line(console, f"interrupted: job {job['id']} is {job['status']}")
        except FleetError as exc:
            _line(console, f"interrupted; the job was not cancelled: {exc.message}")
        return 130
    print_result(console, job)
    return 0 if job["status"] == "succeeded" else 1


def _create(client: Client, args: argparse.Namespace, console: Console) -> FineTuningJob:
    cut = bool(args.lora_truncate)
    pairs = client.upload_file(args.lora_pairs, truncate=cut, timeout=UPLOAD_TIMEOUT)
    _said_file(console, pairs)
    validation = None
    if args.lora_eval:
        validation = client.upload_file(args.lora_eval, truncate=cut, timeout=UPLOAD_TIMEOUT)
        _said_file(console, validation)
    chosen = {
        "rank": args.lora_rank, "alpha": args.lora_alpha, "epochs": args.lora_epochs,
        "learning_rate": args.lora_lr, "batch_size": args.lora_batch,
    }  # fmt: skip
    hyperparameters = {k: v for k, v in chosen.items() if v is not None}
    job = client.create_fine_tuning_job(
        args.lora_model, pairs["id"], validation_file=validation["id"] if validation else None,
        hyperparameters=hyperparameters or None, suffix=args.lora_suffix,
        margin=args.lora_margin,
    )  # fmt: skip
    hp = ", ".join(
        f"{SHORT.get(k, k)} {v:g}"
        for k, v in job["hyperparameters"].items()
        if k != "n_epochs" and isinstance(v, int | float)
    )
    _line(console, f"created job {job['id']} on {job['model']}, suffix {job['suffix']}")
    _line(console, f"  {hp}")
    return job


def _line(console: Console, text: str) -> None:
    console.print(escape(text), highlight=False)


def _said_file(console: Console, f: FileObject) -> None:
    merged = f" ({f['duplicates']} repeats merged)" if f.get("duplicates") else ""
    _line(console, f"uploaded {f['filename']} as {f['id']}: {f['rows']} pairs{merged}")
    warnings = list(f.get("warnings") or ())
    for w in warnings[:3]:
        console.print(f"[yellow]warning:[/] {escape(str(w))}", highlight=False)
    if len(warnings) > 3:
        console.print(f"[yellow]... and {len(warnings) - 3} more warnings[/]")


def follow(client: Client, job_id: str, console: Console) -> FineTuningJob:
    """Wait for the job: its training steps on a bar, its other events as lines."""
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
    )  # fmt: skip
    task: TaskID | None = None

    def on_event(event: FineTuningEvent) -> None:
        nonlocal task
        data = event.get("data") or {}
        step = data.get("step")
        if event.get("type") == "metrics" and "step" in data and isinstance(step, int | float):
            info = _progress_info(data)
            total = data.get("total_steps")
            total = total if isinstance(total, int | float) else None
            if task is None:
                task = progress.add_task("training", total=total, info=info)
            progress.update(task, completed=step, total=total, info=info)
            return
        color = {"error": "red", "warn": "yellow"}.get(str(event.get("level")), "")
        text = escape(str(event.get("message", "")))
        progress.console.print(f"[{color}]{text}[/]" if color else text, highlight=False)

    with progress:
        return client.wait_fine_tuning_job(job_id, poll=POLL, on_event=on_event)


def _progress_info(data: JSONObject) -> str:
    epoch, loss = data.get("epoch"), data.get("train_loss")
    out = f"epoch {epoch:g}" if isinstance(epoch, int | float) else ""
    return out + (f" loss {loss:.4f}" if isinstance(loss, int | float) else "")


def _figure(v: JSON, signed: bool = False) -> str:
    if not isinstance(v, int | float):
        return "-"
    return f"{v:+.4f}" if signed else f"{v:.4f}"


def _object(v: JSON) -> JSONObject:
    return v if isinstance(v, dict) else {}


def print_result(console: Console, job: FineTuningJob) -> None:
    """Base against adapter, the verdict and the model to call, within 80 columns."""
    result = job.get("result") or {}
    base, adapter = _object(result.get("base")), _object(result.get("adapter"))
    if base or adapter:
        table = Table(box=box.SIMPLE_HEAD, width=min(console.width, 52))
        for name in ("", "base", "adapter", "gain"):
            table.add_column(name, justify="right" if name else "left", no_wrap=True)
        for label, key in (("nDCG@10", "ndcg_at_10"), ("recall@10", "recall_at_10")):
            b, a = base.get(key), adapter.get(key)
            gain = a - b if isinstance(a, int | float) and isinstance(b, int | float) else None
            table.add_row(label, _figure(b), _figure(a), _figure(gain, signed=True))
        console.print(table)
    seconds = result.get("train_seconds")
    took = f" (trained in {seconds:.1f} s)" if isinstance(seconds, int | float) else ""
    status = job.get("status")
    if status == "succeeded" and job.get("fine_tuned_model"):
        console.print(f"[green]registered[/]{took}; call it as model", highlight=False)
        _line(console, f"  {job['fine_tuned_model']}")
    elif status == "succeeded":
        said = f"{_figure(result.get('gain'), True)} is below the margin "
        said += _figure(result.get("margin"), True)
        _line(console, f"not registered: the nDCG@10 gain {said}")
        if took:
            _line(console, took.strip(" ()"))
    else:
        error = job.get("error") or {}
        why = error.get("message") or "no error given"
        console.print(f"[red]job {escape(str(status))}:[/] {escape(str(why))}", highlight=False)
