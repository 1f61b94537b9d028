"""``fleetserve bench``: the product's benchmarks.

- ``knee``: open-loop Poisson load against any server with the OpenAI embeddings API,
  several side by side; the knee (highest rate within an SLO), a PNG, markdown, JSON.
- ``sim``: the queue simulator, pull against push at fleet scale.
- ``cost``: fit a model's cost coefficients on this machine.

The comparisons against peers and the distributed experiments are the team's, in the
repository's ``benchmarks/`` folder (``python -m benchmarks``), not in the package.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# name -> what it does
COMMANDS = {
    "knee": "open-loop sweep of embeddings servers: throughput, p50/p99, the knee",
    "sim": "queue simulator: pull against push, 8-256 simulated workers",
    "cost": "fit a model's cost coefficients (fixed, per token, per padded token)",
}
# what moved out of the package, and where
MOVED = {
    "embed": "python -m benchmarks embed",
    "dist": "python -m benchmarks dist",
    "http": "python -m benchmarks http",
    "families": "python -m benchmarks families",
}


def usage() -> str:
    lines = ["usage: fleetserve bench <command> [--help]", "", "commands:"]
    lines += [f"  {name:<5} {what}" for name, what in COMMANDS.items()]
    lines += [
        "",
        "Peer comparisons and distributed experiments live in the repository's",
        "benchmarks/ folder: python -m benchmarks --help (from a source checkout).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    """``fleetserve bench knee|sim|cost ...``; anything else prints what there is (exit 2)."""
    argv = list(argv)
    name, rest = (argv[0], argv[1:]) if argv else ("", [])
    if name == "knee":
        from .knee import main as knee_main

        return knee_main(rest)
    if name == "sim":
        from .sim.cli import main as sim_main

        return sim_main(rest)
    if name == "cost":
        from .cost import main as cost_main

        return cost_main(rest)
    if name in ("-h", "--help"):
        print(usage())
        return 0
    if name in MOVED:
        print(
            f"fleetserve bench {name} moved to the repository's benchmarks/ folder:\n"
            f"  {MOVED[name]}    (from the repository root)\n",
            file=sys.stderr,
        )
    elif name:
        print(f"fleetserve bench: unknown command {name!r}\n", file=sys.stderr)
    print(usage(), file=sys.stderr)
    return 2
