"""``python -m benchmarks fleet``: the fleet manager, measured in real servers.

  trace      cost-aware eviction (gdsf) against LRU: the same Zipf trace over random
             BERTs of mixed sizes, three times the memory budget; --runtimes
             torch,openvino mixes runtimes, whose reloads (and wakes) cost differently
  cold-load  the pinned model's latency while another model loads, before the fleet
             work (--before TREE) and after (--src, this repository's)
  copies     copies of one model under distinct ids, a budget for --room of them and a
             Zipf trace: the resident set's peak growth against the budget, every
             answer checked, miss and hit latency; before (--before TREE) and after

Each writes a table, then JSON and a PNG beside it under --out, named for this
machine's hardware class (fleet-trace-<class>, fleet-trace-torch-openvino-<class>,
fleet-trace-torch-openvino-budget-50pct-<class> with --budget 50%, ...-1client-<class>
with --concurrency 1, ...-vs-before-<class> with --before, cold-load-<class>).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from . import fleet_calibrate, fleet_cold, fleet_copies, fleet_trace
from .fleet_models import CACHE
from .fleet_report import cold_table, copies_table, trace_table, write

ROOT = Path(__file__).resolve().parent.parent
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
CLIENTS = 4  # the trace's closed-loop clients unless told


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="part", required=True)
    t = sub.add_parser("trace", help="gdsf against lru on one Zipf trace")
    t.add_argument("--models", type=int, default=16, help="random BERTs (4-60 MiB)")
    t.add_argument("--requests", type=int, default=600)
    t.add_argument("--concurrency", type=int, default=CLIENTS, help="closed-loop clients")
    t.add_argument("--zipf", type=float, default=1.1, help="the Zipf exponent s")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--repeats", type=int, default=1, help="runs per policy, alternated")
    t.add_argument("--threads", type=int, default=1, help="--torch-threads of the server")
    t.add_argument(
        "--budget",
        default="",
        help="bytes, a size (200MiB) or a percent of what all the models hold (empty: "
        "what the pinned model holds + a third of what the others hold; each measured "
        "by a first load)",
    )
    t.add_argument("--model-dir", default=str(CACHE), help="where the models are cached")
    t.add_argument(
        "--runtimes",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=["torch"],
        help="the unpinned models' runtimes, in equal shares (torch,openvino: reload "
        "costs that differ by runtime, not only by size)",
    )
    t.add_argument("--host-tier", default="", help="--host-tier of the server (default its own)")
    t.add_argument(
        "--before",
        default="",
        help="source tree of the old code: each policy runs on it too (gdsf@before), "
        "alternated with the rest",
    )
    t.add_argument(
        "--held",
        choices=("probe", "learned"),
        default="probe",
        help="what each run's server finds kept of what the models hold: what the probe "
        "measured (probe), or what the runs before it measured too (learned)",
    )
    c = sub.add_parser("cold-load", help="pinned-model latency while a model loads")
    c.add_argument("--before", default="", help="source tree of the old code (or none)")
    c.add_argument("--src", default=str(ROOT / "src"), help="the tree after (default: this)")
    c.add_argument("--minilm", default=MINILM, help="the pinned model under load")
    c.add_argument("--cold-model", default=SMOLLM, help="the model loaded on first use")
    c.add_argument("--catalog", default="", help="extra catalog directory for serve")
    c.add_argument("--rate", type=float, default=20.0, help="requests/s, Poisson")
    c.add_argument("--baseline", type=float, default=5.0, help="seconds before the cold one")
    c.add_argument("--tail", type=float, default=2.0, help="seconds after its answer")
    c.add_argument("--warmup", type=int, default=20, help="requests before measuring")
    c.add_argument("--repeats", type=int, default=1, help="runs per tree, alternated")
    c.add_argument("--threads", type=int, default=0, help="--torch-threads (0: default)")
    c.add_argument("--serve-args", default="", help="extra flags for serve (both trees)")
    c.add_argument("--timeout", type=float, default=600.0, help="seconds, at most")
    c.add_argument("--seed", type=int, default=0)
    cold = c.add_mutually_exclusive_group()
    fresh = "a fresh --cache-dir per run (default): first conversions included"
    cold.add_argument("--cold", dest="cold", action="store_true", default=True, help=fresh)
    kept = "one cache per tree under --log-dir, kept between runs"
    cold.add_argument("--no-cold", dest="cold", action="store_false", help=kept)
    k = sub.add_parser("copies", help="the budget against the resident set, and misses")
    k.add_argument("--model", default=MINILM, help="a bundled model to copy")
    k.add_argument("--copies", type=int, default=12)
    k.add_argument("--room", type=float, default=2.0, help="copies the budget holds")
    k.add_argument("--requests", type=int, default=120)
    k.add_argument("--zipf", type=float, default=1.1, help="the Zipf exponent s")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--repeats", type=int, default=1, help="runs per tree, alternated")
    k.add_argument("--threads", type=int, default=0, help="--torch-threads (0: default)")
    k.add_argument("--before", default="", help="source tree of the old code (or none)")
    k.add_argument("--src", default=str(ROOT / "src"), help="the tree after (default: this)")
    k.add_argument("--runtime", default="", help="the copies' runtime at fp32 (default: rules)")
    k.add_argument("--host-tier", default="", help="--host-tier values to compare: off,100%%")
    for s in (t, c, k):
        s.add_argument("--out", default="docs/bench", help="directory for JSON and PNG")
        s.add_argument("--log-dir", default=".bench/fleet-logs", help="server logs")
    return p


def machine_facts() -> dict[str, Any]:
    """This machine: ``fleetserve hardware``'s class and facts, lscpu's model name."""
    from fleetserve.bench.report import cpu_model, machine
    from fleetserve.catalog.hardware import detect

    hw = detect("cpu")
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next(
            (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if "Model name" in ln),
            cpu_model(),
        )
    except (OSError, subprocess.SubprocessError):
        model = cpu_model()
    return {
        "hardware_class": hw.hardware_class,
        "lscpu_model_name": model,
        "hardware": hw.facts(),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def trace_name(args: argparse.Namespace, hardware_class: str) -> str:
    """fleet-trace-<class>; with other runtimes, a budget, other than 4 clients or a
    tree before, named for them too
    (fleet-trace-torch-openvino-budget-50pct-1client-vs-before-<class>), beside the
    default's."""
    mix = "" if args.runtimes == ["torch"] else "-".join(args.runtimes) + "-"
    if args.budget:
        mix += "budget-" + re.sub(r"[^0-9A-Za-z.]+", "", args.budget.replace("%", "pct")) + "-"
    if args.concurrency != CLIENTS:
        mix += f"{args.concurrency}client{'s' if args.concurrency > 1 else ''}-"
    if args.before:
        mix += "vs-before-"
    return f"fleet-trace-{mix}{hardware_class}"


def main(argv: Sequence[str] = ()) -> int:
    args = _parser().parse_args(list(argv))
    console = Console(width=80)
    facts = machine_facts()
    console.rule(f"python -m benchmarks fleet {args.part}")
    console.print(f"{facts['hardware_class']}: {facts['machine']}")
    try:
        if args.part == "trace":
            result = fleet_trace.run(args, console)
            result["sim"] = fleet_calibrate.predict(result)
            table, name = trace_table(result), trace_name(args, facts["hardware_class"])
        elif args.part == "copies":
            result = fleet_copies.run(args, console)
            table, name = copies_table(result), f"fleet-copies-{facts['hardware_class']}"
        else:
            result = fleet_cold.run(args, console)
            table, name = cold_table(result), f"cold-load-{facts['hardware_class']}"
    except RuntimeError as exc:  # a server that would not start, with its log's tail
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    console.print(table)
    write(Path(args.out), name, {**facts, "args": vars(args), **result}, console)
    return 0
