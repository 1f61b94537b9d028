"""Real processes: a nats-server, `fleetserve gateway` and `fleetserve worker`s."""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.cluster.supervisor import Cluster
from fleetserve.cluster.zygote import Zygote
from fleetserve.logs import child_env
from fleetserve.settings import Settings

from .. import forked
from ..conftest import NO_USER_PROFILES, TINY, TINY_CACHE, TINY_CLASS
from ..tinymodels import build_bert, write_spec
from ..waiting import wait_for

POISON = "tiny/poison-bert"  # its spec allows 64 tokens, its weights only 16 positions
_prefixes = itertools.count()


@pytest.fixture(scope="session")
def cluster_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster")
    cat = root / "catalog"
    write_spec(cat, TINY, build_bert(root / "model"))
    write_spec(cat, POISON, build_bert(root / "short", max_positions=16), max_seq_len=64)
    return cat


@pytest.fixture(scope="session", autouse=True)
def zygote() -> Zygote | None:
    """The tests' zygote for the clusters' environment (tests/forked.py), the one the
    tests' own children of this environment fork from: each worker (and each restart)
    is a fork of it, without ~3 CPU-seconds of imports, and this process starts one
    zygote rather than two. Their environment differs from it only in ``FLEETSERVE_*``
    and ``PYTEST_*``, which no preloaded library reads."""
    return forked.zygote_for(child_env(dict(os.environ)))


class RunningCluster:
    def __init__(self, cluster: Cluster, api: str) -> None:
        self.cluster = cluster
        self.api = api

    def workers(self) -> list[dict[str, Any]]:
        data = httpx.get(self.api + "/v1/models", timeout=5).json()["data"]
        seen: dict[str, dict[str, Any]] = {}
        for m in data:
            for w in m["workers"]:
                seen[w["id"]] = w
        return list(seen.values())

    def worker_metric(self, name: str) -> float:
        """Sum of a metric over the live workers' /metrics."""
        total = 0.0
        for w in self.workers():
            text = httpx.get(w["url"] + "/metrics", timeout=5).text
            for line in text.splitlines():
                if line.startswith(name) and not line.startswith("#"):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def kill_worker(self, i: int) -> None:
        os.kill(self.cluster.workers[i].pid, signal.SIGKILL)
        self.cluster.workers[i].wait()


def start_cluster(catalog: Path, tmp: Path, workers: int = 2, **settings: Any) -> RunningCluster:
    base: dict[str, Any] = {
        "port": 0,
        "catalog": str(catalog),
        "models": f"{TINY},{POISON}",
        "device": "cpu",
        "torch_threads": 1,
        "queue_prefix": f"fail{next(_prefixes)}",
        "request_timeout": 30.0,
        "hardware_class": TINY_CLASS,
        "profile_dir": NO_USER_PROFILES,
        "cache_dir": TINY_CACHE,  # not the user's: what its loads measured is kept there
    }
    base.update(settings)
    base["port"] = free_port()  # a fixed port, so the test knows where the gateway listens
    cluster = Cluster(
        Settings.load(overrides=base),
        workers,
        {**os.environ},
        store_dir=str(tmp / "js"),
        zygote=forked.zygote_for(child_env(dict(os.environ))),
    )
    api = cluster.start()
    if not cluster.wait_ready(api, timeout=120):
        cluster.stop()
        raise RuntimeError("cluster did not become ready")
    return RunningCluster(cluster, api)


@pytest.fixture
def running(cluster_catalog: Path, tmp_path: Path) -> Iterator[RunningCluster]:
    rc = start_cluster(cluster_catalog, tmp_path, workers=2, max_deliver=3)
    yield rc
    rc.cluster.stop()


def free_port() -> int:
    """A free port below the kernel's ephemeral range: the gateway's fixed port. One
    the kernel handed out (bind to 0, then close) could be handed out again at once,
    to nats-server's or a worker's port-0 bind, before the gateway takes it. Each
    pytest-xdist worker draws from its own share of the range: drawn from all of it,
    two workers' clusters once took the same port, and one test read the other's
    gateway (its own could not listen: "Address already in use")."""
    import random
    import socket

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="utf-8").split()[0])
    bottom = max(1024, low - 12000)
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    share = (low - bottom) // workers
    first = bottom + share * (int(worker) % workers if worker.isdigit() else 0)
    for _ in range(200):
        port = random.randrange(first, first + share)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class ClusterCommand:
    """``python -m fleetserve cluster`` as a child process, its stderr collected.

    The supervisor logs ``<child> pid <pid>`` for every start, which is how tests
    find whom to kill.
    """

    def __init__(
        self, catalog: Path, tmp: Path, workers: int = 2, port: int | None = None,
        wait: bool = True, **env: str,
    ) -> None:  # fmt: skip
        self.catalog, self.tmp, self.workers, self.wait = catalog, tmp, workers, wait
        self.port = port or free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "FLEETSERVE_CATALOG": str(catalog),
            "FLEETSERVE_MODELS": TINY,
            "FLEETSERVE_DEVICE": "cpu",
            "FLEETSERVE_TORCH_THREADS": "1",
            "FLEETSERVE_HARDWARE_CLASS": TINY_CLASS,
            "FLEETSERVE_PROFILE_DIR": NO_USER_PROFILES,
            "FLEETSERVE_CACHE_DIR": TINY_CACHE,
            "FLEETSERVE_QUEUE_PREFIX": f"heal{next(_prefixes)}",
            **env,
        }
        self._lines: list[str] = []
        self._lock = threading.Lock()

    def __enter__(self) -> ClusterCommand:
        import subprocess
        import sys

        cmd = [sys.executable, "-m", "fleetserve", "cluster", "--workers", str(self.workers),
               "--port", str(self.port), "--store-dir", str(self.tmp / "js")]  # fmt: skip
        # forked from the tests' zygote: the cluster forks its workers' zygote in turn
        self.proc = forked.popen(
            cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._read, daemon=True).start()
        if self.wait:
            try:
                self.wait_line("Ctrl-C stops everything", 120)
            except AssertionError:
                self.__exit__(None, None, None)
                raise
        return self

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self._lines.append(line.rstrip("\n"))

    def output(self) -> str:
        with self._lock:
            return "\n".join(self._lines)

    def wait_line(self, text: str, timeout: float = 15.0) -> None:
        wait_for(lambda: text in self.output(), timeout, lambda: f"{text!r} in:\n{self.output()}")

    def pids_of(self, child: str) -> list[int]:
        """Every pid ``child`` has had, in order (``worker-0 pid 1234`` lines)."""
        with self._lock:
            lines = list(self._lines)
        pid = re.compile(rf"(?:^|: ){re.escape(child)} pid (\d+)$")  # plain or a log line
        return [int(m.group(1)) for ln in lines if (m := pid.search(ln))]

    def pid_of(self, child: str) -> int:
        return self.pids_of(child)[-1]

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
