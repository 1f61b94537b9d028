"""Back-pressure, deadlines and crashed stages, on real servers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.worker.records import State

from ..conftest import TINY, ServerThread, tiny_settings
from ..hangup import metric
from ..waiting import wait_for

TEXT = "the quick brown fox jumps over the lazy dog"


def encode(srv: ServerThread, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{srv.url}/v1/encode/{TINY}", json={"inputs": [TEXT]}, headers=headers, timeout=30
    )


@contextlib.contextmanager
def serving(catalog: Path, **overrides: Any) -> Iterator[ServerThread]:
    """A fresh server of its own, for tests that break or block it."""
    srv = ServerThread(tiny_settings(catalog, **overrides)).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def small_server(tiny_catalog: Path) -> Iterator[ServerThread]:
    with serving(tiny_catalog, max_queue_depth=2, max_batch_tokens=16, retry_after=2.0) as srv:
        yield srv


def block_forward(srv: ServerThread) -> threading.Event:
    """Occupy the model's forward thread until the returned event is set."""
    assert srv.server is not None
    gate = threading.Event()
    srv.server.runners[TINY]._forward.submit(gate.wait, 30)
    return gate


def pulled(srv: ServerThread) -> int:
    """Requests for the tiny model its worker has pulled (each is timed through the queue
    stage as it is pulled)."""
    return int(metric(srv.url, "fleetserve_stage_latency_seconds_count", model=TINY, stage="queue"))


def held(srv: ServerThread) -> int:
    """Requests for the tiny model the server holds: pulled, or still in its queue."""
    assert srv.server is not None
    queue = srv.server.queue
    return pulled(srv) + int(srv.call(lambda: queue.depth(TINY)))


def test_full_queue_is_429_with_retry_after(small_server: ServerThread) -> None:
    gate = block_forward(small_server)
    with ThreadPoolExecutor(12) as pool:
        futs = [pool.submit(encode, small_server) for _ in range(12)]
        # every request is either turned away or held behind the blocked forward
        wait_for(lambda: sum(f.done() for f in futs) + held(small_server) == 12, 30, "all 12")
        turned_away = [f for f in futs if f.done()]
        rejected = [f.result() for f in turned_away]
        gate.set()
        rest = [f.result() for f in futs if f not in turned_away]
    assert rejected, "some requests should have been rejected while the queue was full"
    for r in rejected:
        assert r.status_code == 429
        assert r.headers["retry-after"] == "2"
        assert r.json()["error"]["code"] == "overloaded"
    statuses = {r.status_code for r in [f.result() for f in futs]}
    assert statuses <= {200, 429} and 200 in statuses
    assert rest and all(r.status_code == 200 for r in rest)  # the held ones are served
    assert httpx.get(small_server.url + "/readyz").status_code == 200


def test_deadline_is_504_and_worker_skips_expired_work(small_server: ServerThread) -> None:
    gate = block_forward(small_server)
    # the first is taken into a batch behind the blocked forward; the rest wait in
    # the batch former and are skipped, not computed, once their deadline has passed
    short = {"x-request-timeout": "0.3"}
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(encode, small_server, **short)
        # taken before the other two come, so they find room in the queue (all three at
        # once met a full queue, 429, when the worker was slow to pull under load)
        wait_for(lambda: first.done() or pulled(small_server) >= 1, 10, "the first taken")
        others = [pool.submit(encode, small_server, **short) for _ in range(2)]
        rs = [f.result() for f in (first, *others)]
    for r in rs:
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "deadline_exceeded"
    gate.set()
    expired = lambda: metric(small_server.url, "fleetserve_expired_total")  # noqa: E731
    assert wait_for(lambda: expired() >= 1, 10, "an expired request to be counted")
    assert encode(small_server).status_code == 200


def test_default_timeout_comes_from_settings(tiny_catalog: Path) -> None:
    with serving(tiny_catalog, request_timeout=0.3) as srv:
        gate = block_forward(srv)
        t0 = time.perf_counter()
        assert encode(srv).status_code == 504
        assert time.perf_counter() - t0 < 5
        gate.set()


def test_crashed_stage_fails_readiness_instead_of_hanging(tiny_catalog: Path) -> None:
    with serving(tiny_catalog) as srv:
        assert srv.server is not None
        runner = srv.server.runners[TINY]
        gate = block_forward(srv)

        def boom() -> list[object]:
            raise RuntimeError("injected batch former bug")

        def taken() -> bool:  # pulled, and out of the batch former: in a batch
            return pulled(srv) >= 1 and srv.call(lambda: len(runner.waiting)) == 0

        with ThreadPoolExecutor(4) as pool:
            # the first is taken into a batch behind the blocked forward before the others
            # come: with all four pulled before the first take, one batch held them all,
            # none met the crash, and none was a 503 (a clean-clone run)
            futs = [pool.submit(encode, srv)]
            wait_for(taken, 10, "the first taken into a batch")
            futs += [pool.submit(encode, srv) for _ in range(3)]
            wait_for(lambda: held(srv) == 4, 10, "the 4 requests to reach the worker")
            srv.call(lambda: setattr(runner.waiting, "take", boom))
            gate.set()
            srv.call(lambda: runner._wake.set())
            t0 = time.perf_counter()
            results = [f.result() for f in futs]
        assert time.perf_counter() - t0 < 10
        assert all(r.status_code in (200, 503) for r in results)
        assert any(r.status_code == 503 for r in results)
        assert httpx.get(srv.url + "/readyz").status_code == 503
        assert httpx.get(srv.url + "/healthz").status_code == 503  # a stage crashed
        after = encode(srv)
        assert after.status_code == 503 and "retry-after" in after.headers
        body = after.json()["error"]
        assert "Traceback" not in body["message"]


@pytest.mark.slow
def test_model_failure_is_500_without_traceback(tiny_catalog: Path) -> None:
    with serving(tiny_catalog) as srv:
        assert srv.server is not None
        adapter = srv.server.runners[TINY].family
        real_forward = adapter.forward

        def broken(items: object) -> object:
            raise RuntimeError("CUDA error: an illegal memory access (secret path /x/y)")

        srv.call(lambda: setattr(adapter, "forward", broken))
        r = encode(srv)
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["code"] == "internal_error"
        assert "Traceback" not in err["message"] and "/x/y" not in err["message"]
        srv.call(lambda: setattr(adapter, "forward", real_forward))
        assert encode(srv).status_code == 200
        assert httpx.get(srv.url + "/readyz").status_code == 200


def test_a_poison_request_fails_alone_and_its_batch_mates_succeed(tiny_catalog: Path) -> None:
    with serving(tiny_catalog, max_deliver=3) as srv:
        assert srv.server is not None
        adapter = srv.server.runners[TINY].family
        real_forward = adapter.forward

        def picky(items: list[list[int]]) -> Any:
            if any(len(ids) > 12 for ids in items):
                raise RuntimeError("this model cannot take that input")
            return real_forward(items)

        srv.call(lambda: setattr(adapter, "forward", picky))
        gate = block_forward(srv)  # queue them up so they share a first batch
        long_text = " ".join(["word"] * 30)
        with ThreadPoolExecutor(6) as pool:
            bodies = [[long_text]] + [[f"short {i}"] for i in range(5)]
            futs = [
                pool.submit(
                    httpx.post, f"{srv.url}/v1/encode/{TINY}", json={"inputs": b}, timeout=30
                )
                for b in bodies
            ]
            wait_for(lambda: held(srv) == 6, 10, "the 6 requests to reach the worker")
            gate.set()
            codes = [f.result().status_code for f in futs]
        assert codes == [500, 200, 200, 200, 200, 200]
        queue = srv.server.queue
        assert len(queue.dead) == 1
        msg, reason = queue.dead[0]
        assert "cannot take that input" in reason and msg.attempts == 3


@pytest.mark.slow
def test_a_crashed_worker_on_a_shared_queue_gives_its_work_back(tiny_catalog: Path) -> None:
    with serving(tiny_catalog) as srv:
        assert srv.server is not None
        srv.server.worker.shared_queue = True  # as `fleetserve worker` runs it
        runner = srv.server.runners[TINY]
        gate = block_forward(srv)

        def boom() -> list[object]:
            raise RuntimeError("injected batch former bug")

        def running() -> int:
            jobs = srv.call(lambda: srv.server.worker.ledger.jobs())  # type: ignore[union-attr]
            return sum(j.record.state is State.RUNNING for j in jobs)

        with ThreadPoolExecutor(3) as pool:
            # one batch behind the blocked forward first, so that the other two wait in
            # the former (sent together, all three could make one batch, with nothing
            # left for the crash to give back)
            futs = [pool.submit(encode, srv, **{"x-request-timeout": "3"})]
            wait_for(lambda: running() == 1, 10, "the first request's batch to start")
            futs += [pool.submit(encode, srv, **{"x-request-timeout": "3"}) for _ in range(2)]
            wait_for(lambda: held(srv) == 3, 10, "the 3 requests to reach the worker")
            srv.call(lambda: setattr(runner.waiting, "take", boom))
            gate.set()
            srv.call(lambda: runner._wake.set())
            # the worker is down once it has given back all it held
            wait_for(lambda: metric(srv.url, "fleetserve_worker_up") == 0, 10, "the worker down")
            # nobody answered them 503: they are back in the queue for another worker
            back = srv.call(lambda: srv.server.queue.depth(TINY))  # type: ignore[union-attr]
            codes = sorted(f.result().status_code for f in futs)
        assert back >= 1 and codes.count(504) == back  # no other worker here to take them
        assert set(codes) <= {200, 504}
