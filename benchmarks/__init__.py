"""The team's benchmarks: comparisons against peers, distributed experiments.

Not shipped in the package (``fleetserve bench`` holds the product's benchmarks: the
knee, the queue simulator, the cost fit). Run from the repository root::

    .venv/bin/python -m benchmarks <name> [--help]
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import cast

# name -> (module, what it measures)
COMMANDS = {
    "embed": ("embed", "fleetserve over HTTP against in-process and infinity-emb"),
    "dist": ("dist", "NATS against embedded; pull against push"),
    "http": ("http_stack", "HTTP servers and frameworks, one fixed reply"),
    "families": ("families", "every model family, HTTP against in-process"),
    "fleet": ("fleet", "eviction policies on a Zipf trace; latency during a cold load"),
    "lora": ("lora", "mixed-adapter batches against the base and one adapter per batch"),
    "lora-slots": ("lora_slots", "LoRA slots in a runtime's graph against its served graph"),
    "priority": ("priority", "queries under bulk load; the broker hop; against infinity"),
    "finetune": ("finetune", "a LoRA from pairs through the API: nDCG@10, time, cost"),
    "soak": ("soak", "mixed traffic, a worker killed, NATS restarted: RSS growth, loss"),
    "selftune": ("selftune", "--tune auto: throughput against time since start, vs infinity"),
    "profiles": ("profiles_ab", "one model on two profile directories, side by side in turns"),
    "usermodel": ("usermodel", "a user's 110M sentence-transformers model (two-line spec)"),
    "suite": ("suite", "make test's CPU by phase, file, test and process (from /proc)"),
}


def usage() -> str:
    lines = ["usage: python -m benchmarks <name> [--help]", "", "benchmarks:"]
    lines += [f"  {name:<10} {what}" for name, (_, what) in COMMANDS.items()]
    lines += [
        "",
        "make bench runs embed after building infinity-emb's venv",
        "(benchmarks/infinity_venv.sh). The product's own: fleetserve bench.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")
    run = cast(Callable[[Sequence[str]], int], module.main)
    return run(rest)
