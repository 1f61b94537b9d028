"""`fleetserve cluster` heals: a worker, the gateway or nats-server that dies comes back.

Real processes: the ``fleetserve cluster`` command itself, with its supervisor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ..conftest import TINY
from ..waiting import wait_for
from .conftest import ClusterCommand
from .test_failures import reference

# the gateway's 503s while NATS is down: nothing was published, so retrying is safe
REFUSED_BEFORE_PUBLISH = (
    "not ready: not connected to the queue",  # the gateway's readiness check
    "not connected to the queue",  # JetStreamQueue.publish
    # a publish in flight as the server died: its ack never came, so the client is
    # told to retry (had the server stored it, the retry only computes it once more)
    "could not enqueue: TimeoutError",
)
TEXTS = [f"healing sentence {i} about {i % 11} things" for i in range(500)]


@pytest.fixture(scope="module")
def want(cluster_catalog: Path) -> np.ndarray[Any, Any]:
    """The reference embeddings, computed once without fleetserve."""
    return reference(cluster_catalog.parent / "model", TEXTS)


async def _embed_all(
    api: str, texts: list[str], *, during: Any = None, retry_503: bool = False
) -> tuple[list[Any], list[httpx.Response]]:
    """Every text as its own request, 100 at a time; ``during`` runs once 100 are done.

    Returns each request's embedding (or its last failed response), and the 503s seen.
    """
    refused: list[httpx.Response] = []
    done = 0
    fired = asyncio.Event()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=api, timeout=60, limits=limits) as client:
        sem = asyncio.Semaphore(100)

        async def one(text: str) -> Any:
            nonlocal done
            async with sem:
                for _ in range(40):
                    r = await client.post("/v1/embeddings", json={"model": TINY, "input": [text]})
                    if r.status_code == 503 and retry_503:
                        refused.append(r)
                        await asyncio.sleep(float(r.headers.get("retry-after", "1")) / 4)
                        continue
                    break
                done += 1
                if done == 100:
                    fired.set()
                if r.status_code != 200:
                    return r
                return r.json()["data"][0]["embedding"]

        async def trigger() -> None:
            await fired.wait()
            during()

        # a task group: one request that raises cancels and awaits the others before
        # the client closes (gather left them, and their sockets, to a later test)
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(t)) for t in texts]
            if during is not None:
                tg.create_task(trigger())
    return [t.result() for t in tasks], refused


def _check(results: list[Any], want: np.ndarray[Any, Any]) -> None:
    failed = [r for r in results if isinstance(r, httpx.Response)]
    assert not failed, f"{len(failed)} failed, first: {failed[0].status_code} {failed[0].text}"
    cos = (np.asarray(results, dtype=np.float32) * want).sum(1)
    assert cos.min() > 0.999, f"request {int(cos.argmin())} got another request's result"


def _worker_url(api: str, wid: str) -> str | None:
    for m in httpx.get(api + "/v1/models", timeout=5).json()["data"]:
        for w in m["workers"]:
            if w["id"] == wid and w["ready"]:
                return str(w["url"])
    return None


def test_a_killed_worker_is_restarted_and_nothing_is_lost(
    cluster_catalog: Path, tmp_path: Path, want: np.ndarray[Any, Any]
) -> None:
    with ClusterCommand(cluster_catalog, tmp_path, workers=2) as cc:
        old_pid = cc.pid_of("worker-1")
        old_url = _worker_url(cc.api, "worker-1")
        killed_at: list[float] = []

        def kill() -> None:
            os.kill(old_pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

        results, _ = asyncio.run(_embed_all(cc.api, TEXTS, during=kill))
        assert killed_at, "the worker was not killed mid-load"
        _check(results, want)
        cc.wait_line("worker-1 exited (-9, killed); restarting in 0.5s (restart 1)")

        def back() -> bool:
            pids = cc.pids_of("worker-1")
            url = _worker_url(cc.api, "worker-1")
            return len(pids) == 2 and url is not None and url != old_url

        # back within ~15 s of the kill (20 s: the 2 cores are shared with the load)
        wait_for(back, 20 - (time.monotonic() - killed_at[0]), cc.output)
        new_pid = cc.pids_of("worker-1")[-1]
        assert new_pid != old_pid and _alive(new_pid)
        assert _alive(cc.pid_of("worker-0"))  # the other one kept serving
        assert cc.proc.poll() is None


def test_nats_server_killed_mid_load_comes_back_and_loses_nothing(
    cluster_catalog: Path, tmp_path: Path, want: np.ndarray[Any, Any]
) -> None:
    with ClusterCommand(cluster_catalog, tmp_path, workers=2) as cc:
        nats_pid = cc.pid_of("nats-server")
        gateway_pid = cc.pid_of("gateway")
        results, refused = asyncio.run(
            _embed_all(cc.api, TEXTS, during=lambda: os.kill(nats_pid, signal.SIGKILL),
                       retry_503=True)
        )  # fmt: skip
        # what JetStream accepted is answered; only a publish that found NATS down
        # was refused, at once, with a retryable 503 (and then retried by the client)
        _check(results, want)
        msgs = {r.json()["error"]["message"] for r in refused}
        assert all("retry-after" in r.headers for r in refused)
        assert all(m.startswith(REFUSED_BEFORE_PUBLISH) for m in msgs), msgs
        cc.wait_line("nats-server exited (-9, killed); restarting in 0.5s (restart 1)")
        assert len(cc.pids_of("nats-server")) == 2
        assert wait_for(lambda: httpx.get(cc.api + "/readyz").status_code == 200, 15)
        # the gateway and workers reconnected: nothing else was restarted
        assert cc.pids_of("gateway") == [gateway_pid]
        assert len(cc.pids_of("worker-0")) == len(cc.pids_of("worker-1")) == 1
        again, _ = asyncio.run(_embed_all(cc.api, TEXTS[:50]))
        _check(again, want[:50])


def test_sigterm_stops_everything_cleanly(cluster_catalog: Path, tmp_path: Path) -> None:
    with ClusterCommand(cluster_catalog, tmp_path, workers=2) as cc:
        children = [cc.pid_of(n) for n in ("nats-server", "gateway", "worker-0", "worker-1")]
        assert all(_alive(p) for p in children)
        cc.proc.send_signal(signal.SIGTERM)
        assert cc.proc.wait(30) == 0
        for pid in children:
            wait_for(lambda pid=pid: not _alive(pid), 10, f"child {pid} to exit with it")
        assert "stopping the cluster" in cc.output()


def test_a_gateway_that_cannot_start_gives_up_with_one_line(
    cluster_catalog: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:  # the gateway's port is held: it fails at every start
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with ClusterCommand(cluster_catalog, tmp_path, workers=1, port=port, wait=False) as cc:
            assert cc.proc.wait(45) == 1
            out = cc.output()
    assert "gateway exited (1); restarting in 0.5s (restart 1)" in out
    assert "restarting in 4s (restart 4)" in out
    assert "error: gateway failed 5 times in a row before becoming ready" in out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
