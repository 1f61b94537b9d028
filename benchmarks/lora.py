"""Mixed-adapter batches against the base model and against one adapter per batch.

``python -m benchmarks lora`` starts ``fleetserve serve`` children from this tree and,
in one run on one machine:

- dense MiniLM (``--runtime``: the base on that runtime rather than as tuned, and the
  figures in ``lora-<runtime>-<class>``): closed-loop clients send the same traffic (4
  short texts a request)
  to the base model, spread evenly over 8 rank-16 adapters (called as
  ``base:adapter`` through ``/v1/embeddings``), and to one of them alone, on four
  servers: as tuned (the base on its tuned runtime; adapter batches in its graph where
  that is OpenVINO, with LoRA slots, else on a torch copy), as tuned with
  ``--lora-in-graph false`` (adapter batches on a torch copy), with the base on torch
  as well (a profile directory saying so: the same runtime as adapter batches), and one
  adapter per batch (``--max-adapters-per-batch 1``, SIE's way);
- upload to first served request for a rank-16 MiniLM adapter (the first and the
  second);
- SmolLM2 chat: tokens per second of the base against 4 adapters.

Phases alternate in rounds; medians over rounds. Writes
``docs/bench/lora-<class>.{json,png}``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape

from .fleet import machine_facts
from .fleet_server import Server
from .lora_models import MINILM, SMOLLM, make_adapters, upload
from .lora_report import BASE, MIXED, MIXED_COPY, MIXED_TORCH, ONE, SINGLE, TUNED, table, write

TEXTS = [
    "How long does a building permit take?",
    "Do I need a permit for a garden shed?",
    "Who pays the property tax on a rented flat?",
    "Can I deduct renovation costs from my taxes?",
]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks lora")
    p.add_argument("--seconds", type=float, default=10.0, help="per phase and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=8, help="concurrent embedding clients")
    p.add_argument("--chat-clients", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--skip-chat", action="store_true")
    p.add_argument("--out", default="docs/bench")
    p.add_argument("--runtime", default="", choices=("", "openvino", "onnx", "torch"),
                   help="serve the base on this runtime rather than as tuned (a profile "
                   "directory saying so; onnx at fp32)")  # fmt: skip
    return p


def closed_loop(
    url: str, clients: int, seconds: float, send: Callable[[httpx.Client, int], int]
) -> dict[str, float]:
    """``clients`` threads calling ``send(client, i)`` for ``seconds``; ``send`` returns
    the units it served (texts, tokens). Units per second and the median latency."""
    stop = time.monotonic() + seconds
    lat: list[float] = []
    units = [0]
    errors = [0]
    lock = threading.Lock()

    def one(k: int) -> None:
        i = k
        with httpx.Client(base_url=url, timeout=120) as c:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    n = send(c, i)
                except httpx.HTTPError:
                    n = -1
                dt = time.perf_counter() - t0
                with lock:
                    if n < 0:
                        errors[0] += 1
                    else:
                        units[0] += n
                        lat.append(dt)
                i += clients

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {
        "per_s": units[0] / wall,
        "p50_ms": statistics.median(lat) * 1e3 if lat else float("nan"),
        "errors": errors[0],
    }


def embed(model: Callable[[int], str]) -> Callable[[httpx.Client, int], int]:
    def send(c: httpx.Client, i: int) -> int:
        r = c.post("/v1/embeddings", json={"model": model(i), "input": TEXTS})
        if r.status_code != 200:
            raise httpx.HTTPStatusError(r.text[:200], request=r.request, response=r)
        return len(TEXTS)

    return send


def chat(model: Callable[[int], str], max_tokens: int) -> Callable[[httpx.Client, int], int]:
    def send(c: httpx.Client, i: int) -> int:
        body = {
            "model": model(i),
            "messages": [{"role": "user", "content": TEXTS[i % len(TEXTS)]}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        r = c.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            raise httpx.HTTPStatusError(r.text[:200], request=r.request, response=r)
        return int(r.json()["usage"]["completion_tokens"])

    return send


def first_served(srv: Server, adapter_dir: Path, name: str) -> dict[str, float]:
    """Seconds from the upload's start to the first 200 for the adapter."""
    t0 = time.perf_counter()
    info = upload(srv.url, adapter_dir, name, MINILM)
    uploaded = time.perf_counter() - t0
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/embeddings", json={"model": f"{MINILM}:{info['id']}", "input": TEXTS[0]})
        r.raise_for_status()
    return {"upload_s": uploaded, "first_served_s": time.perf_counter() - t0}


def rounds(
    phases: dict[str, Callable[[], dict[str, float]]], n: int, console: Console
) -> dict[str, dict[str, float]]:
    """Each phase once per round, in turn; the median of each figure over rounds."""
    seen: dict[str, list[dict[str, float]]] = {k: [] for k in phases}
    for r in range(n):
        for name, run in phases.items():
            res = run()
            seen[name].append(res)
            console.print(
                f"round {r + 1} {name:<28} {res['per_s']:8.1f}/s  p50 {res['p50_ms']:7.1f} ms"
                + (f"  errors {res['errors']:.0f}" if res["errors"] else "")
            )
    return {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in seen.items()}


def profiles_on(root: Path, model: str, runtime: str = "torch") -> Path:
    """A profile directory that serves ``model`` on ``runtime`` at the precision this
    machine's profile picks (fp32 on ONNX Runtime): on torch, the same runtime as
    adapter batches on a torch copy."""
    from fleetserve.assembly import build_profiles
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.profiles import write_profile_file
    from fleetserve.settings import Settings

    choice = build_profiles(Settings()).choose(Catalog.load().get(model))
    precision = choice.profile.precision if choice.profile.precision != "int8" else "fp32"
    precision = "fp32" if runtime == "onnx" else precision
    profile = replace(choice.profile, runtime=runtime, precision=precision, adapters="")
    write_profile_file(root, model, profile, {"written_by": "python -m benchmarks lora"})
    return root


def dense(args: argparse.Namespace, work: Path, console: Console) -> dict[str, Any]:
    adapters = make_adapters(MINILM, work / "minilm", 8, rank=16, targets=("query", "value"))
    logs, src = work / "logs", Path("src")

    served = []  # the base on --runtime rather than as tuned
    if args.runtime:
        served = ["--profile-dir", str(profiles_on(work / "served", MINILM, args.runtime))]

    def common(name: str) -> list[str]:  # each server's adapters in a store of its own
        store = (work / f"store-{name}").as_uri()
        return ["--models", MINILM, "--adapter-store", store, *(served if name != "torch" else [])]

    out: dict[str, Any] = {}
    tuned = Server("lora-tuned", common("tuned"), logs, src=src)
    copy = Server("lora-copy", [*common("copy"), "--lora-in-graph", "false"], logs, src=src)
    profiles = str(profiles_on(work / "p", MINILM))
    on_torch = Server("lora-torch", [*common("torch"), "--profile-dir", profiles], logs, src=src)
    single = Server(
        "lora-single", [*common("single"), "--max-adapters-per-batch", "1"], logs, src=src
    )
    servers = (tuned, copy, on_torch, single)
    try:
        for srv in servers:
            srv.wait_ready()
        out["upload"] = {
            "first adapter": first_served(tuned, adapters[0], "a0"),
            "second adapter": first_served(tuned, adapters[1], "a1"),
        }
        for srv in servers:
            for k, path in enumerate(adapters):
                if srv is not tuned or k >= 2:
                    upload(srv.url, path, f"a{k}", MINILM)
        ids = [f"default/a{k}" for k in range(len(adapters))]
        base = embed(lambda i: MINILM)
        spread = embed(lambda i: f"{MINILM}:{ids[i % len(ids)]}")
        one = embed(lambda i: f"{MINILM}:{ids[0]}")
        n, secs = args.clients, args.seconds
        phases = {
            TUNED: lambda: closed_loop(tuned.url, n, secs, base),
            MIXED: lambda: closed_loop(tuned.url, n, secs, spread),
            ONE: lambda: closed_loop(tuned.url, n, secs, one),
            MIXED_COPY: lambda: closed_loop(copy.url, n, secs, spread),
            BASE: lambda: closed_loop(on_torch.url, n, secs, base),
            MIXED_TORCH: lambda: closed_loop(on_torch.url, n, secs, spread),
            SINGLE: lambda: closed_loop(single.url, n, secs, spread),
        }
        out["throughput"] = rounds(phases, args.rounds, console)
        out["runtimes"] = {srv.name: runtime_of(srv) for srv in servers}
    finally:
        for srv in servers:
            srv.stop()
    return out


def runtime_of(srv: Server) -> dict[str, Any]:
    """Where the base's batches ran, and its adapters' (``/v1/models``)."""
    info = srv.models().get(MINILM, {})
    return {
        "base": f"{info.get('runtime', '')} {info.get('precision', '')}",
        "adapters": info.get("adapters", {}),
    }


def generation(args: argparse.Namespace, work: Path, console: Console) -> dict[str, Any]:
    store = (work / "store-chat").as_uri()
    args_ = ["--models", SMOLLM, "--adapter-store", store]
    srv = Server("lora-chat", args_, work / "logs", src=Path("src"))
    try:
        srv.wait_ready()
        adapters = make_adapters(
            SMOLLM, work / "smollm", 4, rank=16, targets=("q_proj", "v_proj"), causal=True
        )
        ids = [upload(srv.url, p, f"c{k}", SMOLLM)["id"] for k, p in enumerate(adapters)]
        base = chat(lambda i: SMOLLM, args.max_tokens)
        spread = chat(lambda i: f"{SMOLLM}:{ids[i % len(ids)]}", args.max_tokens)
        n, secs = args.chat_clients, args.seconds
        return rounds(
            {
                "chat: base": lambda: closed_loop(srv.url, n, secs, base),
                "chat: 4 adapters, mixed": lambda: closed_loop(srv.url, n, secs, spread),
            },
            args.rounds,
            console,
        )
    finally:
        srv.stop()


def main(argv: Sequence[str] = ()) -> int:
    args = _parser().parse_args(list(argv))
    console = Console(width=80)
    facts = machine_facts()
    console.rule("python -m benchmarks lora")
    console.print(f"{facts['hardware_class']}: {facts['machine']}")
    with tempfile.TemporaryDirectory(prefix="fleetserve-lora-") as tmp:
        work = Path(tmp)
        try:
            result: dict[str, Any] = {"dense": dense(args, work, console)}
            if not args.skip_chat:
                result["chat"] = generation(args, work, console)
        except RuntimeError as exc:
            console.print(f"[red]error:[/] {escape(str(exc))}")
            return 1
    console.print(table(result))
    stem = f"lora-{args.runtime}-" if args.runtime else "lora-"
    write(Path(args.out), stem + facts["hardware_class"], {**facts, **result}, console)
    return 0
