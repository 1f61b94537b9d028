"""Where ``make test`` spends its CPU: by phase, test file, test and kind of process,
with the kernel's threads and what runs outside the suite apart.

    .venv/bin/python -m benchmarks suite [--out .bench/suite] [--tick 0.5] [-- make test]

Runs the command (``make test`` unless one follows ``--``) with a pytest plugin in every
pytest it starts (benchmarks/suite/plugin.py: when each test ran, in which process) and
a thread that reads every process's CPU from ``/proc`` each tick (sampler.py); then puts
each process's CPU on the test its pytest process ran at that moment, servers and
children included (attribute.py), and writes ``suite-cpu.{md,json,png}`` to ``--out``.
For the suite's 10 minutes (issue 24): a clean clone's ``make test`` took 570 to 603 s
on a 2-core cpu-amx, and wall time there follows CPU (README, "make test").
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from ..soak import machine  # the class, a summary and the CPU's flags
from .attribute import Sessions, account
from .plugin import OUT_VAR
from .report import write
from .sampler import Sampler

ROOT = Path(__file__).resolve().parents[2]


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(
        prog="python -m benchmarks suite",
        usage="%(prog)s [--out DIR] [--tick S] [--top N] [-- CMD ...]",
        description=__doc__.split("\n\n")[0],
        epilog="CMD: what to run and account for (default: make test)",
    )
    p.add_argument("--out", default=".bench/suite", help="where the report goes")
    p.add_argument("--tick", type=float, default=0.5, help="seconds between reads of /proc")
    p.add_argument("--top", type=int, default=30, help="rows per table")
    return p.parse_args(argv[:cut]), argv[cut + 1 :] or ["make", "test"]


def environment(records: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[OUT_VAR] = str(records)
    env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} -p benchmarks.suite.plugin".strip()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def main(argv: Sequence[str]) -> int:
    args, command = parse(argv)
    out = Path(args.out)
    records = out / "records"
    shutil.rmtree(records, ignore_errors=True)
    records.mkdir(parents=True)
    sampler = Sampler(args.tick)
    sampler.start()
    began = time.monotonic()
    rc = subprocess.call(command, env=environment(records))
    wall = time.monotonic() - began
    samples = sampler.stop()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = {
        "run": {"command": " ".join(command), "rc": rc, "wall_s": round(wall, 1),
                "cpu_s": round(ru.ru_utime + ru.ru_stime, 1), "tick_s": args.tick,
                "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")},
        "machine": machine(),
        "account": account(samples, Sessions.read(records)).as_dict(),
    }  # fmt: skip
    paths = write(out, r, args.top)
    print(f"{r['run']['command']}: exit {rc}, {wall:.0f} s; report: {paths[1]}", file=sys.stderr)
    return rc
