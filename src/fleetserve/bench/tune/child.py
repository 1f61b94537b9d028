"""One process of a processes-per-device measurement (see ``tune.procs``).

Reads its job (JSON, one line) on stdin, pins itself to its cores, loads the model on
the in-process path, prints ``ready``, waits for ``go``, measures, prints the result
as JSON, and exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any


async def run(job: dict[str, Any]) -> dict[str, Any]:
    from ...catalog import Catalog
    from ...catalog.complete import complete, nowhere
    from ...families import create_family
    from ...runtimes import create_runtime
    from .candidates import Candidate
    from .harness import Stack, saturate
    from .workload import requests

    path = Path(job["path"])
    # completed from the weights the parent measures, as the parent's spec was
    spec = Catalog.load([Path(d) for d in job["catalog"]], weights=nowhere).get(job["model"])
    spec = complete(spec, path)
    cand = Candidate(**job["candidate"])
    runtime = create_runtime(
        cand.runtime,
        device="cpu",
        precision=cand.precision,
        threads=cand.threads,
        cache_dir=Path(job["cache_dir"]),
        options=spec.runtime_options,
    )
    adapter = create_family(spec, runtime, path)
    reqs = requests(spec, path, job["workload"], job["batch"])
    async with Stack(spec, cand.profile(job["hardware_class"]), adapter) as stack:
        for r in reqs[:2]:
            await stack.send(r)
        print("ready", flush=True)
        go = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if go.strip() != "go":
            raise SystemExit(1)
        m = await saturate(stack, reqs, job["clients"], job["duration"], job.get("warmup_s", 0.0))
    return asdict(m)


def main() -> int:
    job = json.loads(sys.stdin.readline())
    if hasattr(os, "sched_setaffinity") and job.get("cores"):
        os.sched_setaffinity(0, job["cores"])
    try:
        result = asyncio.run(run(job))
    except Exception as exc:  # the parent reads one line: say what broke
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
