"""The processes of a ``python -m benchmarks dist`` run, all on loopback.

One nats-server, the embedded server, gateways, workers and push routers, each a
child process. Settings go to them as command-line flags built through
:class:`Settings` (so a misspelt setting fails here); the environment is the one the
bench was given, or the parent's if none was. Children die with the bench.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

import httpx

from fleetserve.cluster.natsd import NatsServer, die_with_parent
from fleetserve.settings import Settings

from . import launch
from .targets import HttpTarget, free_port

ROOT = Path(__file__).resolve().parent.parent  # the repository root


def flags(values: Mapping[str, Any]) -> list[str]:
    """``--flag value`` pairs for these Settings fields, checked and typed by Settings."""
    s = Settings.load(overrides=values)
    out: list[str] = []
    for f in fields(Settings):
        if f.name in values:
            out += [Settings.flag_name(f), str(getattr(s, f.name))]
    return out


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    ready_url: str


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    prefix: str
    health: str  # http://127.0.0.1:PORT, for /readyz and /metrics


class Fleet:
    def __init__(
        self,
        model: str,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        settings: Mapping[str, Any] | None = None,  # more flags for every child
    ) -> None:
        self.model = model
        self.log_dir = log_dir
        self.env = dict(env) if env is not None else None
        self.settings = dict(settings or {})
        self.nats = NatsServer()
        self.children: list[Child] = []

    def start_nats(self) -> str:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self.nats.start()

    def _spawn(
        self,
        name: str,
        args: Sequence[str],
        values: Mapping[str, Any],
        ready: str,
        module: str = "fleetserve",
    ) -> None:
        argv = [sys.executable, "-m", module, *args, *flags(values)]
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the child
        proc = launch.popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=ROOT,  # where ``python -m benchmarks`` finds this package
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self.children.append(Child(name, proc, log, ready))

    def _front(self, name: str, port: int) -> HttpTarget:
        return HttpTarget(name, [], "/v1/embeddings", self.model, "/readyz", port=port)

    def _common(self, **extra: Any) -> dict[str, Any]:
        return {"models": self.model, "log_level": "warning", **self.settings, **extra}

    def embedded(self, name: str) -> HttpTarget:
        """``fleetserve serve``: gateway, in-process queue and worker in one process."""
        port = free_port()
        self._spawn(name, ["serve"], self._common(port=port), f"http://127.0.0.1:{port}/readyz")
        return self._front(name, port)

    def gateway(self, name: str, prefix: str) -> HttpTarget:
        port = free_port()
        values = self._common(port=port, nats=self.nats.url, queue_prefix=prefix)
        self._spawn(name, ["gateway"], values, f"http://127.0.0.1:{port}/readyz")
        return self._front(name, port)

    def worker(self, name: str, prefix: str, threads: int) -> WorkerInfo:
        port = free_port()
        values = self._common(
            nats=self.nats.url,
            queue_prefix=prefix,
            worker_id=name,
            worker_port=port,
            torch_threads=threads,
        )
        health = f"http://127.0.0.1:{port}"
        self._spawn(name, ["worker"], values, health + "/readyz")
        return WorkerInfo(name, prefix, health)

    def router(self, name: str, prefixes: Sequence[str], policy: str) -> HttpTarget:
        port = free_port()
        args = ["dist", "router", "--prefixes", ",".join(prefixes), "--policy", policy]
        values = self._common(port=port, nats=self.nats.url)
        self._spawn(name, args, values, f"http://127.0.0.1:{port}/readyz", module="benchmarks")
        return self._front(name, port)

    def pids(self) -> list[int]:
        nats = [self.nats.pid] if self.nats.pid is not None else []
        return [*nats, *(c.proc.pid for c in self.children)]

    def wait_ready(self, timeout: float = 300.0) -> None:
        waiting = {c.name: c for c in self.children}
        end = time.monotonic() + timeout
        with httpx.Client(timeout=2) as client:
            while waiting and time.monotonic() < end:
                for name, c in list(waiting.items()):
                    if c.proc.poll() is not None:
                        raise RuntimeError(f"{name} exited; see {self.log_dir / name}.log")
                    try:
                        if client.get(c.ready_url).status_code == 200:
                            del waiting[name]
                    except httpx.HTTPError:
                        pass
                time.sleep(0.25)
        if waiting:
            raise RuntimeError(f"not ready within {timeout:.0f}s: {', '.join(waiting)}")

    def stop(self) -> None:
        """SIGTERM by PID, workers and fronts together, then NATS."""
        for c in self.children:
            if c.proc.poll() is None:
                os.kill(c.proc.pid, signal.SIGTERM)
        end = time.monotonic() + 15
        for c in self.children:
            try:
                c.proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
            c.log.close()
        self.children.clear()
        self.nats.stop()


def _metric(text: str, name: str, labels: Mapping[str, str]) -> float:
    total = 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            if all(w in head for w in want):
                total += float(value)
    return total


def scrape(url: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples at ``url``/metrics, matching ``labels``."""
    return _metric(httpx.get(url.rstrip("/") + "/metrics", timeout=5).text, name, labels)


async def scrape_async(client: httpx.AsyncClient, url: str, name: str, **labels: str) -> float:
    r = await client.get(url.rstrip("/") + "/metrics")
    return _metric(r.text, name, labels)
