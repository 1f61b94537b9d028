"""The lag fleetserve reports against the lag KEDA's nats-jetstream scaler computes.

KEDA (kedacore/keda, pkg/scalers/nats_jetstream_scaler.go) reads nats-server's
monitoring endpoint ``/jsz?acc=<account>&consumers=true&config=true``, finds the account
(by id or name), the stream and the durable consumer, and takes
``lag = consumer.num_pending + consumer.num_ack_pending`` (``getMaxMsgLag``); a consumer
it cannot find is an error, not zero. The HPA then asks for ``ceil(lag / lagThreshold)``
replicas. That formula is implemented here, against a real nats-server.

fleetserve reports ``fleetserve_queue_depth{model}``: the worker's refresher sets it to
``JetStreamQueue.depth(model)`` after ``refresh``, which is, summed over the model's two
class lanes, ``num_pending`` plus the messages this worker NAKed that are not redelivered
yet. The two agree when no message is in flight; while work is delivered and not yet
acked, KEDA counts it (``num_ack_pending``) and fleetserve does not; before any worker
created the consumers, fleetserve counts the stored messages and KEDA finds no consumer.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetserve.cluster.natsd import die_with_parent, server_binary
from fleetserve.ops.capacity import consumer_name
from fleetserve.queue import JetStreamQueue, StreamOptions
from fleetserve.wire import Priority, Unavailable

from ..queue.envelopes import env
from ..waiting import async_wait_for

pytest.importorskip("nats", reason="install the extra: pip install 'fleetserve[nats]'")
A, B = "org/model-a", "BAAI/bge-small-en-v1.5"
_prefixes = itertools.count()


class MonitoredNats:
    """nats-server with JetStream and its monitoring endpoint, both on free ports."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="fleetserve-lag-")
        try:
            binary = server_binary()
        except Unavailable as exc:
            pytest.skip(str(exc))
        cmd = [binary, "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "-js",
               "-sd", f"{self.tmp}/store", "--ports_file_dir", self.tmp]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        ports = Path(self.tmp) / f"nats-server_{self.proc.pid}.ports"
        deadline = time.monotonic() + 10
        info: dict[str, Any] = {}
        while time.monotonic() < deadline and not (info.get("nats") and info.get("monitoring")):
            assert self.proc.poll() is None, "nats-server exited at start"
            if ports.exists():
                try:
                    info = json.loads(ports.read_text())
                except ValueError:
                    info = {}
            time.sleep(0.01)
        assert info, "nats-server did not start"
        self.url = info["nats"][0]
        self.monitoring = info["monitoring"][0].removeprefix("http://")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def nats() -> Iterator[MonitoredNats]:
    srv = MonitoredNats()
    yield srv
    srv.stop()


def keda_lag(endpoint: str, account: str, stream: str, consumer: str) -> int:
    """``getMaxMsgLag`` of KEDA's nats-jetstream scaler, from the same request it makes
    (``getNATSJetStreamMonitoringURL``: /jsz with acc, consumers=true, config=true)."""
    query = urllib.parse.urlencode({"acc": account, "consumers": "true", "config": "true"})
    with urllib.request.urlopen(f"http://{endpoint}/jsz?{query}", timeout=5) as resp:
        data = json.load(resp)
    for acc in data.get("account_details") or []:
        if account not in (acc.get("id"), acc.get("name")):
            continue
        for st in acc.get("stream_detail") or []:
            if st["name"] != stream:
                continue
            for c in st.get("consumer_detail") or []:
                if c["name"] == consumer:
                    return int(c.get("num_pending", 0)) + int(c.get("num_ack_pending", 0))
    raise LookupError(f"consumer {consumer!r} not found in stream {stream!r}")


def keda_model_lag(nats: MonitoredNats, q: JetStreamQueue, model: str) -> int:
    """Both class lanes of a model: the sum of its two triggers' lags."""
    s = q.options.stream
    return sum(keda_lag(nats.monitoring, "$G", s, consumer_name(model, p)) for p in Priority)


async def fleetserve_depth(q: JetStreamQueue, model: str) -> int:
    """What a worker exports as fleetserve_queue_depth{model} (worker.process)."""
    await q.refresh([model])
    return q.depth(model)


@pytest.fixture
async def queue(nats: MonitoredNats) -> AsyncIterator[JetStreamQueue]:
    opts = StreamOptions(prefix=f"lag{next(_prefixes)}", storage="memory", ack_wait=30)
    q = JetStreamQueue(nats.url, opts)
    await q.start()
    yield q
    await q.close()


async def publish(q: JetStreamQueue, model: str, n: int, priority: Priority) -> None:
    for _ in range(n):
        await q.publish(env(model, 1, priority=priority), b"{}")


async def test_before_any_worker_keda_sees_no_consumer(
    nats: MonitoredNats, queue: JetStreamQueue
) -> None:
    await publish(queue, A, 3, Priority.BATCH)
    assert await fleetserve_depth(queue, A) == 3  # stored messages, from the stream
    with pytest.raises(LookupError, match="not found"):  # KEDA: a scaler error
        keda_model_lag(nats, queue, A)


async def test_lag_matches_keda_per_model_and_class(
    nats: MonitoredNats, queue: JetStreamQueue
) -> None:
    await publish(queue, A, 5, Priority.BATCH)
    await publish(queue, A, 3, Priority.INTERACTIVE)
    await publish(queue, B, 4, Priority.BATCH)
    # a worker pulls: interactive first, within its budget; consumers now exist
    held_a = await queue.pull([A], budget=2, timeout=2)
    assert [m.envelope.priority for m in held_a] == [Priority.INTERACTIVE] * 2
    held_b = await queue.pull([B], budget=1, timeout=2)
    assert len(held_b) == 1
    per_lane = {
        (m, p): keda_lag(nats.monitoring, "$G", queue.options.stream, consumer_name(m, p))
        for m in (A, B)
        for p in Priority
    }
    assert per_lane == {
        (A, Priority.BATCH): 5,
        (A, Priority.INTERACTIVE): 3,  # 1 waiting + 2 delivered, not acked
        (B, Priority.BATCH): 4,
        (B, Priority.INTERACTIVE): 0,
    }
    # in flight (delivered, unacked): KEDA counts it, fleetserve's depth does not
    assert await fleetserve_depth(queue, A) == keda_model_lag(nats, queue, A) - 2 == 6
    assert await fleetserve_depth(queue, B) == keda_model_lag(nats, queue, B) - 1 == 3
    # acked: gone from both, and they agree
    for m in [*held_a, *held_b]:
        await queue.ack(m)
    assert await fleetserve_depth(queue, A) == keda_model_lag(nats, queue, A) == 6
    assert await fleetserve_depth(queue, B) == keda_model_lag(nats, queue, B) == 3


async def test_put_back_work_counts_in_both(nats: MonitoredNats, queue: JetStreamQueue) -> None:
    await publish(queue, A, 4, Priority.BATCH)
    got = await queue.pull([A], budget=2, timeout=2)
    assert len(got) == 2
    await queue.ack(got[0])
    await queue.nak(got[1])  # put back: NAKed, waits to be redelivered

    async def agree() -> bool:
        return await fleetserve_depth(queue, A) == keda_model_lag(nats, queue, A) == 3

    await async_wait_for(agree, 5.0, "the depth and KEDA's lag to agree at 3")
    again = await queue.pull([A], budget=3, timeout=2)  # the NAKed one comes back too
    assert len(again) == 3 and max(m.attempts for m in again) == 2
    for m in again:
        await queue.ack(m)

    async def drained() -> bool:
        return await fleetserve_depth(queue, A) == keda_model_lag(nats, queue, A) == 0

    await async_wait_for(drained, 5.0, "the depth and KEDA's lag to agree at 0")
