"""``fleetserve cluster --workers N``: the distributed mode on one machine.

It starts a local nats-server with JetStream (a free port, a temporary store unless
``--store-dir`` is given), one gateway and N workers, all as child processes that
get the same settings through ``FLEETSERVE_*`` variables. It prints where each
listens, and Ctrl-C (or SIGTERM) stops them all: workers and gateway first, then NATS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

import httpx
from rich.console import Console

from ..settings import Settings
from .natsd import NatsServer, die_with_parent


def _spawn(args: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "fleetserve", *args],
        env=dict(env),
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


def _stop(procs: list[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
    end = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Cluster:
    def __init__(
        self,
        settings: Settings,
        workers: int,
        env: Mapping[str, str],
        *,
        store_dir: str | None = None,
        console: Console | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("--workers must be at least 1")
        self.settings = settings
        self.n = workers
        self.base_env = dict(env)
        self.console = console or Console(stderr=True)
        self.nats = NatsServer(store_dir=store_dir)
        self.gateway: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []

    def child_env(self, **extra: str) -> dict[str, str]:
        env = {**self.base_env, **self.settings.to_env()}
        env[Settings.env_name("nats")] = self.nats.url
        if not self.settings.torch_threads:  # share the cores between the workers
            env[Settings.env_name("torch_threads")] = str(max(1, (os.cpu_count() or 1) // self.n))
        env.update({Settings.env_name(k): v for k, v in extra.items()})
        return env

    def start(self) -> str:
        url = self.nats.start()
        self.console.print(
            f"[bold]nats-server[/] (JetStream) on {url}, store {self.nats.store_dir}"
        )
        self.gateway = _spawn(["gateway"], self.child_env())
        for i in range(self.n):
            wenv = self.child_env(worker_id=f"worker-{i}", worker_port="0")
            self.workers.append(_spawn(["worker"], wenv))
        return f"http://{self.settings.host}:{self.settings.port}"

    def wait_ready(self, api: str, timeout: float = 300.0) -> bool:
        """Until the gateway is ready and every worker shows up in /v1/models."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(p.poll() is not None for p in self.children):
                return False
            try:
                r = httpx.get(api + "/v1/models", timeout=2)
                live = {w["id"] for m in r.json()["data"] for w in m["workers"] if w["ready"]}
                if len(live) >= self.n:
                    return True
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.25)
        return False

    @property
    def children(self) -> list[subprocess.Popen[bytes]]:
        return [*self.workers, *([self.gateway] if self.gateway else [])]

    def stop(self) -> None:
        _stop(self.workers)
        _stop([self.gateway] if self.gateway else [])
        self.nats.stop()


def run_cluster(
    settings: Settings, workers: int, env: Mapping[str, str], store_dir: str | None = None
) -> int:
    console = Console(stderr=True)
    cluster = Cluster(settings, workers, env, store_dir=store_dir, console=console)

    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        api = cluster.start()
        if not cluster.wait_ready(api):
            console.print("[red]error:[/] the cluster did not become ready; see the output above")
            return 1
        console.print(
            f"[bold green]fleetserve cluster[/] ready: API on {api}, {workers} worker(s), "
            f"NATS on {cluster.nats.url}. Ctrl-C stops everything."
        )
        while True:
            for p in cluster.children:
                if p.poll() is not None:
                    console.print(f"[red]a child process exited ({p.returncode}); stopping[/]")
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("stopping the cluster…")
        return 0
    finally:
        cluster.stop()
