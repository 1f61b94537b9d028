"""A ``fleetserve serve`` child of ``python -m benchmarks fleet``: started, sampled, stopped.

The child runs ``python -m fleetserve serve`` with this interpreter, from the source
tree asked for (``PYTHONPATH=<src>``, run in a scratch directory so that nothing else
is imported in its place), its output in ``<log_dir>/<name>.log``. It dies with the
bench (``PR_SET_PDEATHSIG``) and is stopped by its PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from fleetserve.cluster.natsd import die_with_parent
from fleetserve.fleet.memory import rss_of

from . import launch
from .targets import free_port


class Server:
    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_dir: Path,
        *,
        src: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        argv = [sys.executable, "-m", "fleetserve", "serve", "--port", str(self.port), *args]
        child_env = dict(os.environ if env is None else env)
        if src is not None:
            child_env["PYTHONPATH"] = str(src.resolve())
        scratch = log_dir / f"{name}.cwd"
        scratch.mkdir(exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives with the child
        self.proc = launch.popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=scratch,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 600.0) -> float:
        """Seconds until ``/readyz`` answers 200; a RuntimeError with the log's last
        lines if the child exits or is not ready in time."""
        t0 = time.monotonic()
        with httpx.Client(timeout=2) as client:
            while time.monotonic() - t0 < timeout:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.tail()}")
                try:
                    if client.get(self.url + "/readyz").status_code == 200:
                        return time.monotonic() - t0
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready within {timeout:.0f}s: {self.tail()}")

    def tail(self, lines: int = 4) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) + f" (log: {self.log_path})"

    def models(self) -> dict[str, dict[str, Any]]:
        data = httpx.get(self.url + "/v1/models", timeout=10).json()["data"]
        return {m["id"]: m for m in data}

    def metrics(self, **labels: str) -> dict[str, float]:
        """The samples of ``/metrics`` matching ``labels``, summed by name."""
        return parse_metrics(httpx.get(self.url + "/metrics", timeout=10).text, **labels)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def parse_metrics(text: str, **labels: str) -> dict[str, float]:
    """Prometheus text summed by metric name, over the samples matching ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if all(w in head for w in want):
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return out


class RssSampler:
    """The resident set of ``pid`` every ``interval`` seconds, on a thread; ``peak``."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = rss_of(pid)
        self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_of(self.pid))
            self.samples += 1
            self._done.wait(self.interval)
