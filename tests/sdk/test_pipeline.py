"""Long calls through the SDK against a real server with small limits: many chunks,
pipelined, joined in input order; a bad item fails the call; one progress bar."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from rich.console import Console
from rich.progress import Progress

import fleetserve
from fleetserve import AsyncClient, Client
from fleetserve.gateway.process import GatewayProcess
from fleetserve.sdk import Quantized
from fleetserve.sdk._calls import encode_job
from fleetserve.sdk._chunks import Limits, Span, item_bytes, plan
from fleetserve.wire import Encoding
from fleetserve.wire.codec import loads

from ..conftest import TINY, ServerThread, tiny_settings
from ..tinymodels import WORDS

N = 5000
BODY = 4096  # max_body_bytes: a chunk may carry at most 2 KiB of items
TOKENS = 256  # max_batch_tokens
WIDTH = 4
HOLD_S = 10.0  # the longest a held request waits for its release (a failing test)


def text(i: int) -> str:
    """Distinct texts of up to three words the tiny vocabulary knows."""
    n = len(WORDS)
    return " ".join(WORDS[(i // n**k) % n] for k in range(1 + (i >= n) + (i >= n * n)))


TEXTS = [text(i) for i in range(N)]


@pytest.fixture(scope="module")
def server(tiny_catalog: Path) -> Iterator[ServerThread]:
    srv = ServerThread(
        tiny_settings(tiny_catalog, max_body_bytes=BODY, max_batch_tokens=TOKENS)
    ).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference(server: ServerThread) -> np.ndarray:
    """Each text's embedding from calls of 32 (small enough to go whole)."""
    with Client(server.url) as c:
        return np.concatenate([c.encode(TINY, TEXTS[i : i + 32]) for i in range(0, N, 32)])


def spans_of(server: ServerThread, texts: list[str]) -> list[Span]:
    """The chunks the SDK cuts ``texts`` into for this server."""
    (info,) = httpx.get(server.url + "/v1/models").json()["data"]
    base = encode_job(TINY, texts, "float32", False, {}).base_bytes()
    return plan([item_bytes(t) for t in texts], Limits.from_info(info["limits"]), base, 0)


def test_the_server_advertises_its_limits(server: ServerThread) -> None:
    (info,) = httpx.get(server.url + "/v1/models").json()["data"]
    limits = info["limits"]
    assert limits["max_body_bytes"] == BODY and limits["max_batch_tokens"] == TOKENS
    assert limits["max_batch_size"] >= 1 and limits["max_seq_len"] == info["max_seq_len"]
    assert limits["request_timeout_s"] == 30.0
    assert len(spans_of(server, TEXTS)) > 20


def test_a_gateway_advertises_what_it_knows(tiny_catalog: Path) -> None:
    """The distributed gateway knows no worker's batch budget: the SDK's defaults stand."""
    settings = tiny_settings(tiny_catalog, nats="nats://127.0.0.1:1", max_body_bytes=BODY)
    (info,) = GatewayProcess(settings).models_info()  # not started: no NATS needed
    seq = info["max_seq_len"]
    items = {"max_items": 2048, "max_item_bytes": 1024 * 1024, "max_nesting_depth": 64}
    assert info["limits"] == {
        "max_body_bytes": BODY, "max_seq_len": seq, "request_timeout_s": 30.0, **items
    }  # fmt: skip
    assert Limits.from_info(info["limits"]) == Limits(
        max_body_bytes=BODY, max_seq_len=seq, max_items=2048
    )


class Gate(httpx.BaseTransport):
    """The real transport, counting the POSTs in flight; the first ``width`` wait until
    all ``width`` are in flight at once (``held`` instead: those with no empty item wait
    until ``release`` is set)."""

    def __init__(self, width: int, held: bool = False) -> None:
        self.inner = httpx.HTTPTransport()
        self.width, self.held = width, held
        self.lock = threading.Condition()
        self.full, self.release = threading.Event(), threading.Event()
        self.in_flight = self.most = self.posts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return self.inner.handle_request(request)
        with self.lock:
            self.posts += 1
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            if self.in_flight >= self.width:
                self.full.set()
        try:
            bad = "" in loads(request.read(), Encoding.MSGPACK)["inputs"]
            if self.held and not bad:
                self.release.wait(HOLD_S)
            else:  # held: the bad one answers once all ``width`` are in flight
                self.full.wait(HOLD_S)
            return self.inner.handle_request(request)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.lock.notify_all()

    def wait_idle(self) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: self.in_flight == 0, HOLD_S)

    def close(self) -> None:
        self.inner.close()


def test_encode_in_chunks_pipelined_and_in_order(
    server: ServerThread, reference: np.ndarray
) -> None:
    gate = Gate(WIDTH)
    with Client(server.url, transport=gate, max_in_flight=WIDTH) as c:
        emb = c.encode(TINY, TEXTS)
        assert gate.posts == len(spans_of(server, TEXTS))
        assert gate.most == WIDTH  # pipelined, and never more than max_in_flight
        np.testing.assert_allclose(emb, reference, atol=1e-5)
        q = c.encode(TINY, TEXTS, output_dtype="int8")
    assert isinstance(q, Quantized) and q.values.shape == (N, 32) and q.scales is not None
    assert q.scales.shape == (N,)
    np.testing.assert_allclose(q.dequantize(), reference, atol=float(q.scales.max()))


def test_a_bad_item_in_chunk_three_fails_the_call(server: ServerThread) -> None:
    bad = spans_of(server, TEXTS)[2][0] + 1
    texts = [*TEXTS[:bad], "", *TEXTS[bad + 1 :]]
    gate = Gate(WIDTH, held=True)  # the other chunks wait: the bad one answers first
    with Client(server.url, transport=gate, max_in_flight=WIDTH, max_retries=0) as c:
        with pytest.raises(fleetserve.InvalidInput) as info:
            c.encode(TINY, texts)
        assert gate.posts == WIDTH  # the chunks not yet sent never go
        gate.release.set()  # the replies of those in flight are dropped
        assert gate.wait_idle()
    assert info.value.field == f"inputs[{bad}]"  # its index in the whole list
    assert f"inputs[{bad}]" in info.value.message


class AsyncGate(httpx.AsyncBaseTransport):
    """The async twin of :class:`Gate` (held only), counting the requests cancelled."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.release = asyncio.Event()
        self.posts = self.cancelled = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.posts += 1
            if "" not in loads(await request.aread(), Encoding.MSGPACK)["inputs"]:
                try:
                    await asyncio.wait_for(self.release.wait(), HOLD_S)
                except asyncio.CancelledError:
                    self.cancelled += 1
                    raise
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_async_failure_cancels_the_chunks_in_flight(server: ServerThread) -> None:
    bad = spans_of(server, TEXTS)[2][0]
    texts = [*TEXTS[:bad], "", *TEXTS[bad + 1 :]]
    gate = AsyncGate()  # the other chunks wait: the bad one answers first
    async with AsyncClient(server.url, transport=gate, max_in_flight=WIDTH, max_retries=0) as c:
        with pytest.raises(fleetserve.InvalidInput) as info:
            await c.encode(TINY, texts)
    assert info.value.field == f"inputs[{bad}]"
    assert gate.posts == WIDTH and gate.cancelled == WIDTH - 1  # the others: cancelled


async def test_async_client_joins_in_order(server: ServerThread, reference: np.ndarray) -> None:
    async with AsyncClient(server.url, max_in_flight=8) as c:
        emb = await c.encode(TINY, TEXTS)
        sub = await c.encode(TINY, TEXTS[:40])  # fetched limits are reused
    np.testing.assert_allclose(emb, reference, atol=1e-5)
    np.testing.assert_allclose(sub, reference[:40], atol=1e-5)


def test_score_and_rerank_in_chunks(server: ServerThread, reference: np.ndarray) -> None:
    docs = TEXTS[:1500]
    query = "quick brown fox"
    with Client(server.url) as c:
        [q] = c.encode(TINY, [query])
        want = reference[:1500] @ q
        scores = c.score(TINY, query, docs)
        ranked = c.rerank(TINY, query, docs, top_n=10, return_documents=True)
        every = c.rerank(TINY, query, docs)
    np.testing.assert_allclose(scores, want, atol=1e-5)
    assert [r.index for r in ranked] == [r.index for r in every[:10]]
    assert ranked[0].index == int(np.argmax(want)) and ranked[0].document == docs[ranked[0].index]
    assert sorted(r.index for r in every) == list(range(1500))
    got = [r.relevance_score for r in every]
    assert got == sorted(got, reverse=True)


def test_one_progress_bar_over_the_items(server: ServerThread) -> None:
    out = io.StringIO()
    with Progress(console=Console(file=out, width=100)) as bar, Client(server.url) as c:
        c.encode(TINY, TEXTS[:2000], progress=bar)
    (task,) = bar.tasks
    assert task.total == 2000 and task.completed == 2000 and task.description == TINY
    assert TINY in out.getvalue()


def test_progress_true_draws_on_stderr(
    server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(server.url, progress=True) as c:
        c.encode(TINY, TEXTS[:500])
        c.encode(TINY, TEXTS[:500], progress=False)
    err = capsys.readouterr().err
    assert err.count("500/500") == 1, err
