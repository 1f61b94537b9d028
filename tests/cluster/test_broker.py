"""Workers outlive the broker: a nats-server killed and restarted, a JetStream store on
a full disk. Real processes: nats-server, `fleetserve gateway` and two workers.

Nothing accepted is lost (every request is answered 200 or 503, never a 504 at its
deadline), no worker exits, and ``/readyz`` follows the broker: 503 while it is away
or refuses writes, 200 again on its own once it stores again.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..conftest import TINY
from ..waiting import wait_for
from .conftest import RunningCluster, start_cluster

OUTAGE = 6.0  # seconds nats-server stays down: past nats-py's 5 s request timeout
DEADLINE = 20.0  # a request lost in the fault would be answered 504 after this


def _ready(url: str) -> int:
    try:
        return httpx.get(url + "/readyz", timeout=2).status_code
    except httpx.HTTPError:
        return 0  # not even listening


def _worker_urls(rc: RunningCluster) -> list[str]:
    assert wait_for(lambda: len(rc.workers()) == 2, 30)
    return [str(w["url"]) for w in rc.workers()]


class Load:
    """Requests at a steady pace from a thread of its own, each recorded with its answer."""

    def __init__(self, api: str, every: float = 0.05) -> None:
        self.api, self.every = api, every
        self.answers: list[tuple[float, float, int, str]] = []  # sent, answered, code, body
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: Any = None

    def __enter__(self) -> Load:
        import threading

        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(DEADLINE + 15)
        assert not self._thread.is_alive(), "requests still unanswered"

    def count(self) -> int:
        return len(self.answers)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=50)
        async with httpx.AsyncClient(base_url=self.api, timeout=DEADLINE + 10, limits=limits) as c:
            tasks: list[asyncio.Task[None]] = []
            for i in range(2000):  # bounded: at most 100 s at this pace
                if self._stop.is_set():
                    break
                tasks.append(asyncio.create_task(self._one(c, i)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.every)
            await asyncio.gather(*tasks)

    async def _one(self, c: httpx.AsyncClient, i: int) -> None:
        sent = time.monotonic()
        body = {"model": TINY, "input": [f"broker sentence {i}"]}
        try:
            r = await c.post("/v1/embeddings", json=body)
            code, text = r.status_code, r.text
        except httpx.HTTPError as exc:
            code, text = 0, repr(exc)
        self.answers.append((sent, time.monotonic(), code, text))


def _figures(answers: list[tuple[float, float, int, str]]) -> str:
    codes = [c for _, _, c, _ in answers]
    slowest = max((done - sent for sent, done, c, _ in answers if c == 503), default=0.0)
    full = sum("queue storage full" in t for *_, t in answers)
    return (
        f"{len(codes)} requests: {codes.count(200)} 200, {codes.count(503)} 503 "
        f"({full} 'queue storage full', slowest 503 {slowest:.2f}s)"
    )


def _no_loss(answers: list[tuple[float, float, int, str]]) -> None:
    bad = [(code, text[:200]) for _, _, code, text in answers if code not in (200, 503)]
    assert not bad, f"{len(bad)} of {len(answers)} not 200 or 503, first: {bad[0]}"


def _alive(rc: RunningCluster) -> None:
    assert rc.cluster.gateway is not None and rc.cluster.gateway.poll() is None
    codes = [w.poll() for w in rc.cluster.workers]
    assert codes == [None, None], f"a worker exited: {codes}"


def _mount_tmpfs(path: Path, size: str) -> bool:
    """A small tmpfs at ``path`` (root only); False where it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True, capture_output=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return True


@contextlib.contextmanager
def _supervised(rc: RunningCluster) -> Iterator[None]:
    """The cluster's supervision rounds in a thread, as ``fleetserve cluster`` runs them."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(0.25):
            rc.cluster.supervise()

    t = threading.Thread(target=loop, name="supervise", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(30)


def _fill(path: Path) -> Path:
    ballast = path / "ballast"
    with open(ballast, "wb", buffering=0) as f:
        try:
            for _ in range(64):  # 64 MiB at most; the tmpfs holds 24
                f.write(b"\0" * (1 << 20))
        except OSError:  # ENOSPC: full
            pass
    return ballast


@pytest.fixture(scope="module")
def broker_cluster(
    cluster_catalog: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningCluster, bool]]:
    """One cluster for both faults (a start costs ~10 s of the 2 cores), its JetStream
    store on a 24 MiB tmpfs where one can be mounted; with whether it is."""
    tmp = tmp_path_factory.mktemp("broker")
    store = tmp / "js"  # start_cluster's store directory
    tmpfs = _mount_tmpfs(store, "24m")
    try:
        rc = start_cluster(cluster_catalog, tmp, request_timeout=DEADLINE)
        try:
            yield rc, tmpfs
        finally:
            rc.cluster.stop()
    finally:
        if tmpfs:
            subprocess.run(["umount", "-l", str(store)], check=False, timeout=10)


def test_a_5s_broker_outage_loses_no_worker_and_no_request(
    broker_cluster: tuple[RunningCluster, bool],
) -> None:
    """nats-server killed -9 under load and restarted 6 s later on the same store (the
    finding's 5 s, and enough that nats-py's 5 s request timeout surely expires first).

    Fails on the code before this change: each worker's pull re-created its consumers
    after the disconnect with a 5 s JetStream request, whose TimeoutError crashed the
    worker stage ('worker stage crashed'), so both workers exited and every request
    after the restart went unanswered until its 504."""
    rc, _ = broker_cluster
    workers = _worker_urls(rc)
    with Load(rc.api) as load:
        assert wait_for(lambda: load.count() >= 20, 30)  # served before the fault
        rc.cluster.nats.kill()
        killed = time.monotonic()
        assert wait_for(lambda: _ready(rc.api) == 503, 5)
        assert wait_for(lambda: all(_ready(w) == 503 for w in workers), 5)
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - killed)))  # the outage itself
        rc.cluster.nats.start()
        back = time.monotonic()
        wait_for(lambda: _ready(rc.api) == 200, 15, "the gateway to be ready")
        assert wait_for(lambda: all(_ready(w) == 200 for w in workers), 15)
        ready_in = time.monotonic() - back
        served_from = back + 5.0
        wait_for(lambda: time.monotonic() > served_from + 2.0, 10)  # 2 s of load after
    _alive(rc)
    answers = load.answers
    _no_loss(answers)
    after = [code for sent, _, code, _ in answers if sent >= served_from]
    assert len(after) >= 10, len(after)
    assert after.count(200) == len(after), f"{after.count(200)}/{len(after)} served"
    print(f"outage: ready {ready_in:.1f}s after the restart; {_figures(answers)}")


def test_a_full_jetstream_disk_is_a_503_that_says_so_and_readiness_follows(
    broker_cluster: tuple[RunningCluster, bool],
) -> None:
    """The JetStream store on a 24 MiB tmpfs, filled with a file under load, then freed.

    Fails on the code before this change: each publish waited 5 s for an answer
    JetStream never sent and got 503 'could not enqueue: TimeoutError', and /readyz
    stayed 200 throughout. Now: 503 'queue storage full ...' (at once once a probe or a
    publish found it), /readyz 503 on the gateway and the workers, the
    fleetserve_queue_storage_full_total counter up; nothing accepted is lost.

    nats-server 2.15 keeps a stream whose file store hit ENOSPC failing after the
    space is freed (its critical write error is sticky until the stream is reopened):
    the cluster's supervisor, which runs here as ``fleetserve cluster`` runs it, sees
    the write error in nats-server's log and restarts nats-server once the store has
    room again; gateway and workers are then ready on their own, nothing restarted by
    hand (before, nothing did: the fleet stayed down until someone restarted it)."""
    rc, tmpfs = broker_cluster
    if not tmpfs:
        pytest.skip("cannot mount a tmpfs here: the full-disk test needs root")
    workers = _worker_urls(rc)
    store = rc.cluster.nats.store_dir
    with Load(rc.api, every=0.1) as load:
        assert wait_for(lambda: load.count() >= 10, 30)
        ballast = _fill(store)
        wait_for(lambda: _ready(rc.api) == 503, 15, "the gateway to be not ready")
        assert wait_for(lambda: all(_ready(w) == 503 for w in workers), 15)
        assert wait_for(lambda: any("queue storage full" in t for *_, t in load.answers), 10)
        _alive(rc)
        with _supervised(rc):
            before = rc.cluster.nats.pid
            ballast.unlink()
            # the supervisor reopens the store; then the gateway and workers are ready (on
            # a loaded machine the gateway read ready again before the reopen, whose
            # outage then came after what the test took for the fleet back)
            wait_for(lambda: rc.cluster.nats.pid != before, 30, "nats-server to restart")
            wait_for(lambda: _ready(rc.api) == 200, 30, "the gateway to be ready")
            assert wait_for(lambda: all(_ready(w) == 200 for w in workers), 20)
            back = time.monotonic()
            wait_for(lambda: time.monotonic() > back + 7.0, 10)  # 2 s of load from 5 s after
    _alive(rc)
    _no_loss(load.answers)
    print(f"full disk: {_figures(load.answers)}")
    after = [c for sent, _, c, _ in load.answers if sent >= back + 5.0]
    assert after and after.count(200) == len(after), after
    text = httpx.get(rc.api + "/metrics", timeout=5).text
    line = next(ln for ln in text.splitlines() if ln.startswith("fleetserve_queue_storage_full"))
    assert float(line.rsplit(" ", 1)[1]) >= 1
