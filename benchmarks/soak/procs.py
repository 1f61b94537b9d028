"""The processes a soak runs against, all on loopback, each a child of the bench.

- embedded: one ``fleetserve serve``;
- distributed: a nats-server with a JetStream file store, ``fleetserve gateway`` and two
  ``fleetserve worker`` processes. :meth:`Stack.kill_worker` SIGKILLs one worker and
  starts a replacement; :meth:`Stack.restart_nats` stops nats-server (SIGTERM) and starts
  it again on the same port and store directory.

Settings reach the children as ``FLEETSERVE_*`` variables (checked through
:class:`Settings` first, so a misspelt setting fails here), as ``fleetserve cluster``
passes them; each child's output goes to ``<logs>/<name>.log``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from fleetserve.cluster.natsd import NatsServer, die_with_parent
from fleetserve.settings import Settings

from ..targets import free_port

ROOT = Path(__file__).resolve().parents[2]  # the repository root


def child_env(values: Mapping[str, Any], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment plus ``FLEETSERVE_*`` for ``values`` (typed by Settings)."""
    s = Settings.load(overrides=values)
    env = dict(os.environ if base is None else base)
    for name in values:
        env[Settings.env_name(name)] = str(getattr(s, name))
    return env


@dataclass
class Child:
    name: str
    role: str  # server, gateway, worker
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    ready_url: str


@dataclass
class Stack:
    """One mode's processes. ``settings`` go to every child; ``models`` they serve."""

    mode: str  # embedded or distributed
    models: list[str]
    log_dir: Path
    settings: dict[str, Any] = field(default_factory=dict)
    workers: int = 2
    children: list[Child] = field(default_factory=list)
    nats: NatsServer | None = None
    url: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    _serial: int = 0

    def start(self, timeout: float = 600.0) -> str:
        """Start every process and wait until each is ready; returns the API's URL."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        if self.mode == "embedded":
            self._spawn("server", "server", ["serve"], {"port": port}, self.url + "/readyz")
        else:
            store = self.log_dir / "jetstream"
            shutil.rmtree(store, ignore_errors=True)  # a fresh store: no earlier run's work
            self.nats = NatsServer(store_dir=store)
            self.nats.start()
            self._spawn("gateway", "gateway", ["gateway"], self._nats(port=port), self.url)
            self.children[-1].ready_url = self.url + "/readyz"
            for _ in range(self.workers):
                self._new_worker()
        self.wait_ready(self.children, timeout)
        return self.url

    def _nats(self, **extra: Any) -> dict[str, Any]:
        assert self.nats is not None
        return {"nats": self.nats.url, "stream_storage": "file", **extra}

    def _new_worker(self) -> Child:
        name = f"worker-{chr(ord('a') + self._serial)}"
        self._serial += 1
        port = free_port()
        threads = max(1, (os.cpu_count() or 2) // self.workers)
        values = self._nats(worker_id=name, worker_port=port, torch_threads=threads)
        return self._spawn(name, "worker", ["worker"], values, f"http://127.0.0.1:{port}/readyz")

    def _spawn(
        self, name: str, role: str, args: list[str], values: dict[str, Any], ready: str
    ) -> Child:
        env = child_env({"models": ",".join(self.models), **self.settings, **values})
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives with the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetserve", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        child = Child(name, role, proc, log, ready)
        self.children.append(child)
        return child

    def live(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() is None]

    def pids(self) -> dict[str, int]:
        """Each live process by name (``nats`` included), for the RSS sampler."""
        out = {c.name: c.proc.pid for c in self.live()}
        if self.nats is not None and self.nats.proc is not None and self.nats.proc.poll() is None:
            out["nats"] = self.nats.proc.pid
        return out

    def roles(self) -> dict[str, str]:
        return {c.name: c.role for c in self.children} | {"nats": "nats"}

    @staticmethod
    def wait_ready(children: list[Child], timeout: float) -> None:
        waiting = {c.name: c for c in children}
        end = time.monotonic() + timeout
        with httpx.Client(timeout=2) as client:
            while waiting and time.monotonic() < end:
                for name, c in list(waiting.items()):
                    if c.proc.poll() is not None:
                        raise RuntimeError(f"{name} exited; see {c.log.name}")
                    try:
                        if client.get(c.ready_url).status_code == 200:
                            del waiting[name]
                    except httpx.HTTPError:
                        pass
                time.sleep(0.25)
        if waiting:
            raise RuntimeError(f"not ready within {timeout:.0f}s: {', '.join(waiting)}")

    def _event(self, what: str, t0: float, **facts: Any) -> dict[str, Any]:
        ev = {"event": what, "start": t0, "end": time.time(), **facts}
        ev["seconds"] = round(ev["end"] - t0, 2)
        self.events.append(ev)
        return ev

    def kill_worker(self, timeout: float = 300.0) -> dict[str, Any]:
        """SIGKILL the oldest live worker, start a replacement, wait until it is ready."""
        t0 = time.time()
        victim = next(c for c in self.live() if c.role == "worker")
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        victim.log.close()
        fresh = self._new_worker()
        self.wait_ready([fresh], timeout)
        return self._event("kill worker", t0, killed=victim.name, replacement=fresh.name)

    def restart_nats(self, timeout: float = 60.0) -> dict[str, Any]:
        """Stop nats-server (SIGTERM) and start it on the same port and store directory;
        done when the gateway and every worker are ready again."""
        assert self.nats is not None and self.nats.proc is not None
        t0 = time.time()
        os.kill(self.nats.proc.pid, signal.SIGTERM)
        self.nats.proc.wait(30)
        down = time.time() - t0
        self.nats.start()
        up = time.time() - t0
        self.wait_ready(self.live(), timeout)
        return self._event("restart nats", t0, down_s=round(down, 2), up_s=round(up, 2))

    def stop(self) -> None:
        """SIGTERM by PID, the fronts and workers together, then NATS."""
        for c in self.live():
            os.kill(c.proc.pid, signal.SIGTERM)
        end = time.monotonic() + 20
        for c in self.children:
            try:
                c.proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
            c.log.close()
        if self.nats is not None:
            self.nats.stop()
