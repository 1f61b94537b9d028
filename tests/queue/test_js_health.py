"""Whether JetStream accepts writes (queue/js_health.py): the classification of its
errors and the probe that makes readiness follow it.

All of these fail on the code before issue 22's item 7: there was no such module, a
storage error was a 503 'could not enqueue: ...' and nothing probed JetStream's writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from fleetserve.queue.jetstream import JetStreamQueue, StreamOptions
from fleetserve.queue.js_health import Backoff, Writes, probe_forever, storage_refusal


class _APIError(Exception):
    def __init__(self, err_code: int, description: str) -> None:
        super().__init__(description)
        self.err_code, self.description = err_code, description


def test_storage_errors_say_queue_storage_full_and_stream_limits_do_not() -> None:
    full = storage_refusal(_APIError(10047, "insufficient storage resources available"))
    assert full is not None and full.startswith("queue storage full")
    assert "insufficient storage" in full
    assert storage_refusal(_APIError(10023, "insufficient resources")) is not None
    # the bounded queue: a 429 elsewhere, not a storage fault
    assert storage_refusal(_APIError(10077, "maximum messages per subject exceeded")) is None
    assert storage_refusal(TimeoutError()) is None


class _FakeJS:
    """Refuses (times out) until ``stores`` is set; counts purges of the probe."""

    def __init__(self) -> None:
        self.stores = asyncio.Event()
        self.purged = 0
        self.probed = asyncio.Event()

    async def publish(self, subject: str, body: bytes, timeout: float) -> Any:
        self.probed.set()
        if not self.stores.is_set():
            raise TimeoutError
        return None

    async def purge_stream(self, stream: str, subject: str) -> bool:
        assert subject == "t.probe"
        self.purged += 1
        return True


async def test_the_probe_refuses_while_writes_time_out_and_accepts_once_they_store() -> None:
    writes, js = Writes(), _FakeJS()
    counted: list[int] = []
    writes.on_storage_full = lambda: counted.append(1)
    task = asyncio.create_task(
        probe_forever(writes, js, StreamOptions(prefix="t"), 0.01, lambda: True, timeout=0.05)
    )
    try:
        async with asyncio.timeout(5):
            while writes.refused is None:
                await asyncio.sleep(0.01)
        assert "queue storage full" in writes.refused and counted
        js.stores.set()
        async with asyncio.timeout(5):
            while writes.refused is not None:
                await asyncio.sleep(0.01)
        assert js.purged >= 1
    finally:
        await _stop(task)


async def test_no_probe_while_disconnected() -> None:
    writes, js = Writes(), _FakeJS()
    task = asyncio.create_task(
        probe_forever(writes, js, StreamOptions(prefix="t"), 0.01, lambda: False, timeout=0.05)
    )
    await asyncio.sleep(0.1)  # ten probe periods, in which no probe may come
    await _stop(task)
    assert not js.probed.is_set() and writes.refused is None


async def test_a_probe_that_fails_across_a_reconnect_refuses_nothing() -> None:
    """nats-server killed and restarted under a probe: its publish times out, but the
    connection came back meanwhile; that is no full disk (seen in test_heal's kill of
    nats-server, as a 503 'queue storage full or failing')."""
    writes, js = Writes(), _FakeJS()
    reconnects: list[float] = [0.0]
    probes = 0

    async def publish(subject: str, body: bytes, timeout: float) -> Any:
        nonlocal probes
        probes += 1
        reconnects.append(float(probes))  # the link came back while this one waited
        raise TimeoutError

    js.publish = publish  # type: ignore[method-assign]
    task = asyncio.create_task(
        probe_forever(
            writes, js, StreamOptions(prefix="t"), 0.01, lambda: True, timeout=0.05,
            reconnected_at=lambda: reconnects[-1],
        )
    )  # fmt: skip
    try:
        async with asyncio.timeout(5):
            while probes < 5:
                await asyncio.sleep(0.01)
        assert writes.refused is None and writes.storage_full == 0
    finally:
        await _stop(task)


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(first=0.1, most=0.4)
    assert [b.failed(0.0, TimeoutError()) for _ in range(4)] == [0.1, 0.2, 0.4, 0.4]
    assert b.wait(0.0) == 0.4
    b.succeeded()
    assert b.wait(0.0) <= 0


def test_a_held_refusal_ends_on_its_own_and_one_without_hold_does_not() -> None:
    """Before, a refusal lasted until a probe accepted: with probes off, for good."""
    now = [0.0]
    held, lasting = Writes(hold=1.0, clock=lambda: now[0]), Writes(clock=lambda: now[0])
    for w in (held, lasting):
        w.refuse("queue storage full: test")
    now[0] = 0.5
    assert held.refused is not None and lasting.refused is not None
    now[0] = 1.0
    assert held.refused is None and lasting.refused is not None
    assert held.storage_full == 1  # still counted


class _Conn:
    is_connected = True


class _PublishJS:
    """Refuses the first publish for lack of storage, stores the rest."""

    def __init__(self) -> None:
        self.calls = 0

    async def publish(self, subject: str, body: bytes, headers: Any, timeout: float) -> None:
        self.calls += 1
        if self.calls == 1:
            raise _APIError(10047, "insufficient storage resources available")


def _queue(probe_interval: float) -> JetStreamQueue:
    q = JetStreamQueue("nats://unused", probe_interval=probe_interval, retry_after=30.0)
    q.nc, q.js, q._closed = _Conn(), _PublishJS(), False
    return q


async def test_without_probes_a_publish_that_stores_makes_the_queue_ready_again() -> None:
    """Before, one refused publish with queue_probe_interval=0 kept healthy (/readyz,
    fleetserve_queue_ready) false until a restart: only probes accepted again."""
    from fleetserve.wire import Unavailable

    from .envelopes import env

    q = _queue(probe_interval=0)
    with contextlib.suppress(Unavailable):
        await q.publish(env(), b"x")
    assert not q.healthy and q.writes.refused is not None
    pending = await q.publish(env(), b"x")  # no probes: the publish itself tries
    pending.cancel()
    assert q.healthy and q.writes.refused is None


async def test_with_probes_a_refusal_is_answered_at_once_until_accepted() -> None:
    from fleetserve.wire import Unavailable

    from .envelopes import env

    q = _queue(probe_interval=2.0)
    for _ in range(2):
        try:
            await q.publish(env(), b"x")
        except Unavailable as err:
            assert err.message.startswith("queue storage full")
    assert q.js.calls == 1 and not q.healthy  # the second never reached JetStream
    q.writes.accept()  # a probe stored
    (await q.publish(env(), b"x")).cancel()
    assert q.healthy


class _AwayPuller:
    """A puller whose pulls fail while ``away`` (the broker is down)."""

    def __init__(self) -> None:
        self.away, self.calls = True, 0

    async def pull(self, *args: Any) -> list[Any]:
        self.calls += 1
        if self.away:
            from nats.errors import TimeoutError as NatsTimeout

            raise NatsTimeout
        return []


@pytest.mark.slow
async def test_failed_pulls_back_off_and_log_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, a failed pull waited a fixed second and logged a warning every time."""
    q = _queue(probe_interval=2.0)
    puller = _AwayPuller()
    q.puller = puller  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="fleetserve.queue"):
        start = asyncio.get_running_loop().time()
        while puller.calls < 4:
            assert await q.pull(["m/a"], 10, 0.5) == []
        assert asyncio.get_running_loop().time() - start < 1.5  # 0.1, 0.2, 0.4: not 1 s each
        puller.away = False
        while puller.calls < 6:
            await q.pull(["m/a"], 10, 0.5)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "not answering" in lines[0] and "answers pulls again" in lines[1]


async def test_a_bug_in_a_pull_is_no_outage() -> None:
    q = _queue(probe_interval=2.0)

    class Broken:
        async def pull(self, *args: Any) -> list[Any]:
            raise KeyError("a bug")

    q.puller = Broken()  # type: ignore[assignment]
    with pytest.raises(KeyError):
        await q.pull(["m/a"], 10, 0.1)


async def test_an_unknown_publish_failure_is_logged_in_full_and_answered_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, the 503 said 'could not enqueue: <type> <the exception's text>'."""
    from fleetserve.wire import Unavailable

    from .envelopes import env

    class Reset:
        async def publish(self, *args: Any, **kwargs: Any) -> None:
            raise ConnectionResetError("nats://10.0.0.7:4222: connection reset")

    q = _queue(probe_interval=2.0)
    q.js = Reset()
    with caplog.at_level(logging.WARNING, "fleetserve.queue"), pytest.raises(Unavailable) as info:
        await q.publish(env(), b"x")
    assert info.value.message == "could not enqueue: ConnectionResetError; retry"
    assert "10.0.0.7" in caplog.text
