"""`fleetserve cluster`: one command starts NATS, a gateway and workers; Ctrl-C stops all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fleetserve.cli import main

from .. import forked
from ..conftest import TINY, TINY_CLASS
from .conftest import free_port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _children(pid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return found.stdout.split()


def test_cluster_serves_and_ctrl_c_stops_everything(cluster_catalog: Path) -> None:
    port = free_port()
    env = {**os.environ, "FLEETSERVE_CATALOG": str(cluster_catalog), "FLEETSERVE_MODELS": TINY,
           "FLEETSERVE_DEVICE": "cpu", "FLEETSERVE_HARDWARE_CLASS": TINY_CLASS}  # fmt: skip
    proc = forked.popen(  # (the cluster forks its workers' zygote: tests/cluster/conftest.py)
        [sys.executable, "-m", "fleetserve", "cluster", "--workers", "2", "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "Ctrl-C stops everything" in line or not line:
                break
        out = "".join(lines)
        assert "nats-server (JetStream) on nats://127.0.0.1:" in out
        assert f"http://127.0.0.1:{port}" in out
        r = httpx.post(f"http://127.0.0.1:{port}/v1/encode/{TINY}", json={"inputs": ["hi"]})
        assert r.status_code == 200
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
        assert {w["id"] for w in models[0]["workers"]} == {"worker-0", "worker-1"}
        children = _children(proc.pid)
        assert len(children) == 3  # nats-server, gateway, the workers' zygote
        workers = [w for c in children for w in _children(int(c))]
        assert len(workers) == 2  # forked from the zygote (fork_workers, the default)
        for i, pid in enumerate(workers):
            assert f"worker-{i} pid" in out and re.search(rf"worker-\d pid {pid}\b", out)
        children += workers
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        for pid in children:
            deadline = time.monotonic() + 10
            while _alive(int(pid)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(int(pid)), f"child {pid} outlived the cluster"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.parametrize("command", ["gateway", "worker", "dlq"])
def test_distributed_commands_need_a_nats_url(
    command: str, capfd: pytest.CaptureFixture[str]
) -> None:
    # only the gateway serves on --port (a worker's health port is --worker-port)
    args = {"gateway": ["gateway", "--port", "0"], "worker": ["worker"], "dlq": ["dlq", "list"]}
    assert main(args[command]) != 0
    err = capfd.readouterr().err
    assert "needs a NATS URL: --nats nats://HOST:4222" in err
    assert "Traceback" not in err


def test_readme_shows_the_cluster_command_tested_above() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "fleetserve cluster --workers 2" in readme
    assert "fleetserve gateway --nats" in readme and "fleetserve worker  --nats" in readme
