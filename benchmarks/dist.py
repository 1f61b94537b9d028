"""``python -m benchmarks dist``: the distributed mode against the embedded one, and pull
against push, with the real model on this machine.

1. Embedded ``fleetserve serve`` against nats-server + gateway + 1 worker, and + 2
   workers splitting the cores: the same client and 64-token sentences as
   ``python -m benchmarks embed`` (saturation: 4 clients x 32 sentences; latency: 1 client
   x 1 sentence); interleaved rounds, medians.
2. Pull (workers share one stream) against push (each worker its own stream; a router
   picks round-robin or least-outstanding) over the same 2 workers and a seeded mix of
   request sizes, swept over client counts to find the knee.
3. Put-backs and redeliveries per 1000 requests, from the workers' ``/metrics``.

``python -m benchmarks dist router ...`` is the push router process the run starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console

REAL = "sentence-transformers/all-MiniLM-L6-v2"


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks dist",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=REAL)
    p.add_argument("--rounds", type=int, default=3, help="rounds of part 1")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per saturation run")
    p.add_argument("--tokens", type=int, default=64, help="tokens per sentence (part 1)")
    p.add_argument("--batch", type=int, default=32, help="sentences per request at saturation")
    p.add_argument("--concurrency", type=int, default=4, help="clients at saturation")
    p.add_argument("--sweep", default="1,2,4,8,16,32", help="client counts (part 2)")
    p.add_argument("--sweep-rounds", type=int, default=2)
    p.add_argument("--sweep-duration", type=float, default=6.0, help="seconds per point")
    p.add_argument("--warm", type=float, default=1.0, help="seconds before each window")
    p.add_argument("--pool", type=int, default=4000, help="distinct mixed requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="seconds a measurement may wait for other processes to leave the cores",
    )
    p.add_argument("--out", default=".bench/results")
    p.add_argument("--name", default="dist", help="file stem of the outputs")
    p.add_argument("--logs", default=".bench/results/dist-logs", help="the processes' logs")
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    a = p.parse_args(list(argv))
    if a.quick:
        a.rounds, a.duration, a.sweep, a.sweep_rounds = 1, 2.0, "1,4,16", 1
        a.sweep_duration, a.warm, a.pool, a.quiet_wait = 2.0, 0.5, 500, 2.0
    return a


def main(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> int:
    """``env``: the children's environment (default: this process's, inherited)."""
    argv = list(argv)
    if argv[:1] == ["router"]:
        from .dist_push import router_main

        return router_main(argv[1:])
    from .dist_report import machine_info, write
    from .dist_run import run

    a = _args(argv)
    console = Console()
    console.rule(f"python -m benchmarks dist: {a.model}")
    info = machine_info()
    console.print(info["summary"])
    result = run(a, env, console)
    result["machine"] = info
    result["args"] = vars(a)
    write(Path(a.out), a.name, result, console)
    return 0
