"""``python -m benchmarks soak``: mixed traffic for minutes, in both modes, with a worker
killed and nats-server restarted in the middle; RSS over time and every request's fate.

Traffic (``traffic.py``): every catalog model with real weights on these machines
(all-MiniLM-L6-v2 dense, its token vectors and its zero-shot head, splade-tiny sparse
vectors and rerank, SmolLM2-135M chat) and a random LoRA on MiniLM, through the SDK.

- embedded: ``fleetserve serve``. It has no child process to kill (device children
  exist only under ``fleetserve worker --devices``), so it runs undisturbed.
- distributed: nats-server (JetStream file store), a gateway and two workers; at 40 %
  of the run one worker is SIGKILLed and a replacement started, at 60 % nats-server is
  stopped and started again on the same port and store.

It writes ``<out>/soak-<mode>-<hardware class>.{json,md,png}`` (see ``report.py`` for
warm-up, growth and the targets) and exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from .procs import ROOT, Stack
from .report import analyse
from .traffic import MINILM, MODELS, drive, prime

NO_DISRUPTION = (
    "fleetserve serve runs its worker in-process and has no device child to kill "
    "(those exist only under fleetserve worker --devices); no NATS to restart"
)


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mode", choices=["embedded", "distributed", "both"], default="both")
    p.add_argument("--minutes", type=float, default=10.0, help="traffic per mode [10]")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second [2]")
    p.add_argument("--max-in-flight", type=int, default=32)
    p.add_argument("--sample", type=float, default=0.0, help="RSS every N s (0: by length)")
    p.add_argument("--warmup", type=float, default=0.0, help="seconds (0: a fifth of the run)")
    p.add_argument("--window", type=float, default=0.0, help="seconds (0: min(60, a tenth))")
    p.add_argument("--timeout", type=float, default=30.0, help="per attempt, seconds")
    p.add_argument("--retries", type=int, default=10, help="SDK retries of 429/503")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="embedded: torch threads [1, as each of the two workers gets; 0: one per core, "
        "which collapses on cores other work shares]",
    )
    p.add_argument("--no-adapter", action="store_true", help="no LoRA traffic")
    p.add_argument("--no-disrupt", action="store_true", help="distributed: no kill, no restart")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="docs/bench")
    p.add_argument("--logs", default=".bench/results/soak-logs")
    return p.parse_args(list(argv))


def machine() -> dict[str, Any]:
    from fleetserve.catalog.hardware import detect

    hw = detect("cpu")
    return {"class": hw.hardware_class, "summary": hw.summary(), **hw.facts()}


def make_adapter(work: Path) -> Path:
    """A random rank-8 LoRA on MiniLM's query and value projections (kept between runs)."""
    from ..lora_models import make_adapters

    done = work / "a0" / "adapter_model.safetensors"
    if not done.exists():
        make_adapters(MINILM, work, 1, rank=8, targets=("query", "value"))
    return work / "a0"


def upload_adapter(url: str, path: Path) -> str:
    from fleetserve import Client

    with Client(url, timeout=120) as c:
        info = c.upload_adapter(path, "soak-minilm", base=MINILM)
    return str(info["id"]).split("@", 1)[0]


def run_mode(mode: str, a: argparse.Namespace, hw: dict[str, Any], console: Console) -> bool:
    seconds = a.minutes * 60
    logs = ROOT / a.logs / mode
    settings: dict[str, Any] = {"log_level": "warning"}
    if mode == "embedded":  # a store of this run's own (distributed: NATS's object store)
        settings["adapter_store"] = (logs / "adapter-store").resolve().as_uri()
        settings["torch_threads"] = a.torch_threads
    stack = Stack(mode, list(MODELS), logs, settings)
    console.rule(f"soak {mode}: {a.minutes:g} min at {a.rate:g}/s")
    t_start = time.time()
    adapter = None if a.no_adapter else make_adapter(ROOT / a.logs / "adapter")
    url = stack.start()
    ready_s = time.time() - t_start
    console.print(f"ready in {ready_s:.0f}s at {url}: {stack.pids()}")
    adapter_id = None if adapter is None else upload_adapter(url, adapter)
    primed = asyncio.run(prime(url, adapter_id))
    console.print(f"first request of each kind (s): {primed}")
    at: dict[float, Callable[[], Awaitable[None]]] = {}
    if mode == "distributed" and not a.no_disrupt:
        at[0.4 * seconds] = lambda: _thread(stack.kill_worker, console)
        at[0.6 * seconds] = lambda: _thread(stack.restart_nats, console)
    from .rss import Sampler

    t0 = time.time()
    every = a.sample or (5.0 if seconds >= 300 else 2.0)
    sampler = Sampler(stack.pids, every, t0)
    sampler.start()
    try:
        outcomes = asyncio.run(
            drive(
                url,
                seconds,
                a.rate,
                t0,
                adapter=adapter_id,
                max_in_flight=a.max_in_flight,
                timeout=a.timeout,
                retries=a.retries,
                seed=a.seed,
                at=at,
            )
        )
    finally:
        sampler.stop()
        roles = stack.roles()
        stack.stop()
    r = analyse(
        sampler.samples,
        roles,
        outcomes,
        stack.events,
        t0=t0,
        seconds=seconds,
        warmup=a.warmup or seconds / 5,
        window=a.window or min(60.0, seconds / 10),
    )
    loads = [s["load1"] for s in sampler.samples] or [0.0]
    r |= {
        "run": {
            "mode": mode,
            "minutes": a.minutes,
            "seconds": seconds,
            "rate": a.rate,
            "max_in_flight": a.max_in_flight,
            "timeout_s": a.timeout,
            "retries": a.retries,
            "settings": {k: v for k, v in settings.items() if k != "adapter_store"},
            "models": list(MODELS),
            "adapter": adapter_id,
            "ready_s": round(ready_s, 1),
            "first_request_s": primed,
            "no_disruption": NO_DISRUPTION if mode == "embedded" else "",
        },
        "machine": hw,
        "load": {"mean": sum(loads) / len(loads), "max": max(loads)},
        "roles": roles,
        "samples": sampler.samples,
        "requests_timeline": [(o.sent, o.result) for o in outcomes],
    }
    from .output import write

    paths = write(ROOT / a.out, f"soak-{mode}-{hw['class']}", r)
    _show(r, console, paths)
    return bool(r["met"])


async def _thread(f: Callable[[], dict[str, Any]], console: Console) -> None:
    ev = await asyncio.to_thread(f)
    console.print(f"  {ev['event']}: back in {ev['seconds']}s {ev}")


def _show(r: dict[str, Any], console: Console, paths: list[Path]) -> None:
    q = r["requests"]
    total = r["rss"].get("total", {}).get("growth_pct")
    console.print(
        f"sent {q['sent']}, served {q['served']}, lost {q['lost']}, errors "
        f"{q['errors_by_status']}, bad {q['bad_answers']}, expected 503 {q['expected_503']}, "
        f"other 5xx {q['unexpected_5xx']}; RSS growth total {total} %"
    )
    for k, v in r["targets"].items():
        console.print(f"  {k}: {'met' if v else 'NOT MET'}")
    console.print("wrote " + ", ".join(str(p) for p in paths))


def main(argv: Sequence[str] = ()) -> int:
    a = _args(argv)
    console = Console()
    hw = machine()
    console.print(hw["summary"])
    modes = ["embedded", "distributed"] if a.mode == "both" else [a.mode]
    met = [run_mode(m, a, hw, console) for m in modes]
    return 0 if all(met) else 1
