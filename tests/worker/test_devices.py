"""``fleetserve worker --devices cpu:0,cpu:1`` end to end: real processes, a real NATS.

One device process is killed (SIGKILL) under load: every request still gets the
right answer, its in-flight work goes to the other device through the local queue
(``ack_wait`` is far longer than the test, so upstream redelivery cannot be what
saves it), and the killed device process is restarted.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fleetserve.cluster import NatsServer
from fleetserve.cluster.natsd import die_with_parent
from fleetserve.gateway.process import GatewayProcess
from fleetserve.settings import Settings
from fleetserve.wire.heartbeat import Heartbeat
from fleetserve.worker.cores import core_share, runtime_device

from .. import forked
from ..conftest import TINY, ServerThread, tiny_settings
from ..waiting import wait_for

_prefixes = itertools.count()
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "river", "bank"]
TEXTS = [" ".join(WORDS[j % 10] for j in range(i, i + 1 + i % 7)) for i in range(24)]


class GatewayThread:
    """``fleetserve gateway`` in a thread with its own event loop."""

    def __init__(self, settings: Settings) -> None:
        self.proc: GatewayProcess | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._settings = settings
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        from rich.console import Console

        self.loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.proc = GatewayProcess(self._settings, console=Console(quiet=True))
        try:
            await self.proc.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            await self.proc.stop()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.proc.stop()

    def start(self) -> GatewayThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        assert self.proc is not None
        return f"http://127.0.0.1:{self.proc.port}"

    def beat(self, worker_id: str) -> dict[str, Any] | None:
        assert self.proc is not None and self.loop is not None
        fut = asyncio.run_coroutine_threadsafe(_workers(self.proc), self.loop)
        return next((b.as_dict() for b in fut.result(5) if b.id == worker_id), None)

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


async def _workers(proc: GatewayProcess) -> list[Heartbeat]:
    return proc.registry.workers()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def spawn_device(path: str, settings: Settings) -> subprocess.Popen[bytes]:
    """One device process, as ``DevicePool`` starts it."""
    cmd = [sys.executable, "-m", "fleetserve.worker.device_child", "--socket", path]
    cmd += ["--index", "0", "--device", "cpu:0"]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, preexec_fn=die_with_parent)
    assert child.stdin is not None
    child.stdin.write(json.dumps(settings.to_env()).encode())
    child.stdin.close()
    return child


@pytest.mark.services  # a device process: a worker's child that serves
async def test_a_device_process_stops_when_its_parent_goes_away(tiny_catalog: Path) -> None:
    from fleetserve.queue import MemoryQueue
    from fleetserve.queue.local import LocalQueueServer

    hello = asyncio.Event()
    with tempfile.TemporaryDirectory(prefix="fs-dev-") as tmp:
        server = LocalQueueServer(
            MemoryQueue(), os.path.join(tmp, "q.sock"), on_hello=lambda _: hello.set()
        )
        await server.start()
        child = spawn_device(server.path, tiny_settings(tiny_catalog, log_level="warning"))
        try:
            await asyncio.wait_for(hello.wait(), 30)
            assert server.clients[0]["ready"] and server.clients[0]["device"] == "cpu:0"
            await server.close()  # as if the parent died
            for _ in range(100):
                if child.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            assert child.returncode == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_device_helpers() -> None:
    assert runtime_device("cpu:1") == "cpu" and runtime_device("cuda:1") == "cuda:1"
    assert [core_share(i, 2, [0, 1, 2, 3]) for i in range(2)] == [[0, 1], [2, 3]]
    assert [core_share(i, 3, [0, 1]) for i in range(3)] == [[0], [1], [0]]


@pytest.fixture
def stack(nats_server: NatsServer, tiny_catalog: Path) -> Iterator[tuple[GatewayThread, str]]:
    prefix = f"devices{next(_prefixes)}"
    common = {"nats": nats_server.url, "queue_prefix": prefix, "stream_storage": "memory"}
    roots = str(tiny_catalog.parent)  # a hot add may name the tiny model's directory
    gw = GatewayThread(
        tiny_settings(tiny_catalog, request_timeout=20, model_roots=roots, **common)
    ).start()
    cmd = [sys.executable, "-m", "fleetserve", "worker", "--devices", "cpu:0,cpu:1"]
    cmd += ["--catalog", str(tiny_catalog), "--models", TINY, "--worker-id", "dw"]
    cmd += ["--nats", nats_server.url, "--queue-prefix", prefix, "--stream-storage", "memory"]
    # info: the "local queue on <socket>" line is checked below
    cmd += ["--ack-wait", "120", "--max-batch-tokens", "64", "--log-level", "info"]
    env = {**os.environ, "COLUMNS": "400"}  # one line per message
    pids: set[int] = set()
    with tempfile.TemporaryFile() as log:
        worker = forked.popen(  # from the tests' zygote: the host forks its devices' zygote
            cmd, stdout=log, stderr=log, env=env, start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
        try:
            yield gw, "dw"
            beat = gw.beat("dw") or {}
            pids.update(d["pid"] for d in beat.get("devices", []) if d["pid"])
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            gw.stop()
            log.seek(0)
            out = log.read().decode(errors="replace")
    assert worker.returncode == 0, out[-3000:]
    for pid in pids:
        wait_for(lambda pid=pid: gone(pid), 10, f"device process {pid} to exit")
    sock = re.search(r"local queue on (\S+);", out)
    assert sock is not None, out[-3000:]
    assert not os.path.exists(os.path.dirname(sock.group(1)))  # the socket is cleaned up


def test_a_killed_device_process_loses_no_request(
    stack: tuple[GatewayThread, str], tiny_server: ServerThread
) -> None:
    gw, wid = stack

    def devices(b: dict[str, Any] | None) -> list[dict[str, Any]]:
        return list((b or {}).get("devices") or [])

    def all_ready() -> dict[str, Any] | None:
        b = gw.beat(wid)
        ok = devices(b) and all(d["ready"] for d in devices(b)) and b and b["ready"]
        return b if ok else None

    def encode(base: str, text: str) -> tuple[int, Any]:
        r = httpx.post(f"{base}/v1/encode/{TINY}", json={"inputs": [text]}, timeout=30)
        return r.status_code, r.json()

    expected = {t: encode(tiny_server.url, t)[1]["embeddings"][0] for t in TEXTS}
    beat = wait_for(all_ready, 30, "both device processes to be ready")
    assert [d["device"] for d in devices(beat)] == ["cpu:0", "cpu:1"]
    victim = devices(beat)[0]["pid"]
    results: list[tuple[str, int, Any]] = []
    stop = threading.Event()

    def load(k: int) -> None:
        for i in itertools.count(k):
            if stop.is_set():
                return
            text = TEXTS[i % len(TEXTS)]
            results.append((text, *encode(gw.url, text)))

    parent = beat["url"]

    def metric(name: str, label: str) -> float:
        text = httpx.get(f"{parent}/metrics", timeout=5).text
        found = re.search(rf"^{name}{{{label}}} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    def caught_holding_work() -> float:
        """Freeze the device process; it holds whatever its last pull got."""
        os.kill(victim, signal.SIGSTOP)
        time.sleep(0.3)  # its last pull is answered, and what it wrote is read, meanwhile
        held = metric("fleetserve_device_in_flight", 'device="cpu:0"')
        while held != (now := metric("fleetserve_device_in_flight", 'device="cpu:0"')):
            held = now  # a reply it wrote before it froze was still being read
        if not held:
            os.kill(victim, signal.SIGCONT)
            time.sleep(0.05)
        return held

    with ThreadPoolExecutor(6) as pool:
        futs = [pool.submit(load, k) for k in range(6)]
        try:
            wait_for(lambda: len(results) >= 20, 15, "some load")
            held = wait_for(caught_holding_work, 15, "the device process to hold work")
            os.kill(victim, signal.SIGKILL)  # mid-request
            served = len(results)
            wait_for(lambda: len(results) >= served + 30, 15, "load on the other device")
        finally:
            stop.set()
        for f in futs:
            f.result()
    # upstream cannot have redelivered it (ack_wait 120 s): it went over locally
    redelivered = 'model="tiny/dense-bert"'
    wait_for(lambda: metric("fleetserve_redeliveries", redelivered) >= held, 5, "redeliveries")

    def restarted() -> bool:
        ds = devices(gw.beat(wid))
        return bool(ds) and ds[0]["pid"] not in (None, victim) and ds[0]["ready"]

    wait_for(restarted, 20, "the killed device process to be restarted")
    with ThreadPoolExecutor(6) as pool:
        after = list(pool.map(lambda t: (t, *encode(gw.url, t)), TEXTS))
    bad = [(t, code, body) for t, code, body in [*results, *after] if code != 200]
    assert not bad, bad[:3]
    for text, _, body in [*results, *after]:
        np.testing.assert_allclose(body["embeddings"][0], expected[text], atol=1e-5)
    assert metric("fleetserve_device_restarts_total", 'device="cpu:0"') == 1


def test_each_device_process_serves_adapters_from_the_object_store(
    stack: tuple[GatewayThread, str], tiny_catalog: Path, tmp_path: Path
) -> None:
    from ..lora.test_serving import reference, upload
    from ..tiny_lora import make_lora

    gw, wid = stack
    wait_for(lambda: (gw.beat(wid) or {}).get("ready"), 30, "the device processes")
    base = tiny_catalog.parent / "model"
    path = make_lora(base, tmp_path / "dev-lora", seed=9)
    r = upload(gw.url, path, f"dev-{next(_prefixes)}")
    assert r.status_code == 201, r.text
    aid = r.json()["id"]
    want = reference(base, path, TEXTS[:4])
    with ThreadPoolExecutor(4) as pool:  # spread over both device processes
        got = list(
            pool.map(
                lambda _: httpx.post(
                    f"{gw.url}/v1/encode/{TINY}",
                    json={"inputs": TEXTS[:4], "adapter": aid, "normalize": False},
                    timeout=30,
                ),
                range(8),
            )
        )
    for resp in got:
        assert resp.status_code == 200, resp.text
        np.testing.assert_allclose(np.asarray(resp.json()["embeddings"]), want, atol=1e-5)


def test_a_multi_device_host_releases_its_devices_keep_alives_at_once(
    stack: tuple[GatewayThread, str],
) -> None:
    """Before, the parent never served releases: the gateway counted it among the model's
    holders, waited its full second and answered ``released: false``."""
    gw, wid = stack

    def ready() -> bool:
        b = gw.beat(wid) or {}
        return bool(b.get("ready")) and all(d["ready"] for d in b.get("devices") or [])

    wait_for(ready, 30, "the device processes to be ready")
    r = httpx.post(
        f"{gw.url}/v1/encode/{TINY}",
        json={"inputs": ["keep me"]},
        headers={"X-Keep-Alive": "60s"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    start = time.monotonic()
    r = httpx.delete(f"{gw.url}/v1/models/{TINY}/keep-alive", timeout=10)
    assert r.status_code == 200 and r.json()["released"] is True, r.text
    assert 0 < r.json()["left_s"] <= 60 and time.monotonic() - start < 0.9


def test_the_device_processes_follow_a_hot_add_and_remove(
    stack: tuple[GatewayThread, str], tiny_catalog: Path
) -> None:
    """A model added at the gateway (the fleet's models bucket) is served by the device
    processes of a multi-device worker, and goes with its removal."""
    gw, wid = stack
    wait_for(lambda: bool((gw.beat(wid) or {}).get("ready")), 30, "the devices to be ready")
    model = "hot/on-devices"
    spec = {"id": model, "sources": [str(tiny_catalog.parent / "model")], "family": "dense"}
    r = httpx.post(f"{gw.url}/v1/models", json={**spec, "max_seq_len": 16}, timeout=30)
    assert r.status_code == 201, r.text
    body = {"inputs": ["on a device"]}
    r = httpx.post(f"{gw.url}/v1/encode/{model}", json=body, timeout=30)
    assert r.status_code == 200, r.text
    # the parent's heartbeat lists what its device processes serve (the fleet view)
    wait_for(lambda: model in (gw.beat(wid) or {}).get("models", {}), 10, "the beat to list it")
    assert httpx.delete(f"{gw.url}/v1/models/{model}", timeout=30).status_code == 200
    r = httpx.post(f"{gw.url}/v1/encode/{model}", json=body, timeout=30)
    assert r.status_code == 404 and repr(model) in r.json()["error"]["message"]
    wait_for(lambda: model not in (gw.beat(wid) or {}).get("models", {}), 10, "it to leave")


@pytest.mark.services  # a device process: a worker's child that serves
@pytest.mark.tunes  # run apart (tests/conftest.py)
async def test_a_device_process_tunes_in_the_background(tmp_path: Path) -> None:
    """``--tune auto`` reaches the devices of a multi-device worker: a device process
    runs the background tune, and stops it with itself (the run says cancelled)."""
    from fleetserve.bench.tune.runs import RunStore
    from fleetserve.queue import MemoryQueue
    from fleetserve.queue.local import LocalQueueServer

    from ..bench.tune.test_background import settings as tune_settings

    s = tune_settings(tmp_path, tune_lock=str(tmp_path / "tune.lock"), log_level="warning")
    runs = RunStore(tmp_path / "runs")
    hello = asyncio.Event()
    with tempfile.TemporaryDirectory(prefix="fs-dev-") as tmp:
        server = LocalQueueServer(
            MemoryQueue(), os.path.join(tmp, "q.sock"), on_hello=lambda _: hello.set()
        )
        await server.start()
        child = spawn_device(server.path, s)
        try:
            await asyncio.wait_for(hello.wait(), 30)
            for _ in range(1200):  # its tune starts once the model has loaded
                if runs.list() or child.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            (run,) = runs.list()
            assert run["status"] == "running" and run["quick"] is True
            await server.close()  # the parent goes: the device process stops, its tune too
            for _ in range(400):
                if child.poll() is not None and runs.list()[0]["status"] != "running":
                    break
                await asyncio.sleep(0.05)
            assert child.returncode == 0
            assert runs.list()[0]["status"] == "cancelled"
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
