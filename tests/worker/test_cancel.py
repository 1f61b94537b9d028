"""Cancelled work stops wherever it is in the worker, on real servers: pulled after its
cancel, parked for its model's load, waiting in the batch former, generating (its
slot goes to the next sequence), and a long prompt during its chunked prefill."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.catalog import Catalog
from fleetserve.wire import DeadlineExceeded, Encoding, Envelope, Part, Task
from fleetserve.worker.cancel import SKEW, CancelSet

from ..conftest import ServerThread, tiny_settings
from ..hangup import Hangup, metric
from ..tiny_generate import build_llama
from ..tinymodels import build_bert, write_spec
from ..waiting import wait_for

BERT = "tiny/bert"
LAZY = "tiny/lazy-bert"
CHAT = "tiny/chat"
LONG = 3000


# -- the set of cancelled ids -----------------------------------------------------------
def _env(rid: str, part: Part | None = None) -> Envelope:
    e = Envelope(rid, BERT, Task.ENCODE, Encoding.JSON, Encoding.JSON, 1, time.time() + 30)
    return dataclasses.replace(e, part=part)


def test_the_cancel_set_knows_requests_and_their_slices() -> None:
    ids = CancelSet()
    ids.add("r1", time.time() + 30)
    assert ids.hit(_env("r1")) and not ids.hit(_env("r2"))
    assert ids.hit(_env("r1/0-4", Part("r1", 0, 4)))  # a slice of it, put back by a worker
    assert not ids.hit(_env("r2/0-4", Part("r2", 0, 4)))


def test_a_retry_with_the_same_id_after_the_cancel_is_not_cancelled() -> None:
    ids = CancelSet(clock=lambda: 1000.0)
    ids.add("r1", 2000.0)
    before = dataclasses.replace(_env("r1"), enqueued_at=999.0)
    retry = dataclasses.replace(_env("r1"), enqueued_at=1001.0)  # sent again later
    assert ids.hit(before) and not ids.hit(retry)


def test_the_cancel_set_is_bounded_and_forgets_after_the_deadline() -> None:
    now = [1000.0]
    ids = CancelSet(cap=3, clock=lambda: now[0])
    for i in range(5):
        ids.add(f"r{i}", 2000.0)
    assert len(ids) == 3 and "r0" not in ids and "r4" in ids  # the oldest left first
    ids.add("short", 1001.0)
    now[0] = 1001.0 + SKEW + 1  # past its deadline and the clock skew allowed
    ids.add("new", 3000.0)
    assert "short" not in ids and "new" in ids and "r4" in ids


# -- a batch model --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cancel")
    bert = build_bert(root / "bert")
    cat = root / "catalog"
    write_spec(cat, BERT, bert, pinned=True)
    write_spec(cat, LAZY, bert)  # loads on first use
    llama = build_llama(root / "llama", max_positions=4096)
    profile = {"cpu": {"precision": "fp32", "max_batch_tokens": 8192, "max_batch_size": 1}}
    write_spec(cat, CHAT, llama, family="generate", max_seq_len=4096, profiles=profile,
               options={"prefill_chunk": 16})  # fmt: skip
    return cat


@contextlib.contextmanager
def serving(catalog_dir: Path, models: str) -> Iterator[ServerThread]:
    settings = tiny_settings(catalog_dir, models=models)
    srv = ServerThread(settings, Catalog.load([catalog_dir], bundled=False)).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def bert_server(catalog_dir: Path) -> Iterator[ServerThread]:
    with serving(catalog_dir, BERT) as srv:
        yield srv


def block_compute(srv: ServerThread) -> threading.Event:
    """Occupy the compute thread (forward passes, warm-ups) until the event is set."""
    assert srv.server is not None
    gate = threading.Event()
    srv.server.runners[BERT]._forward.submit(gate.wait, 30)
    return gate


def worker_state(srv: ServerThread) -> dict[str, int]:
    assert srv.server is not None
    w, former = srv.server.worker, srv.server.runners[BERT].waiting
    return srv.call(  # type: ignore[no-any-return]
        lambda: {
            "jobs": len(w.ledger.jobs()),
            "loading": len(w.ledger.parked()),
            "waiting": len(former),
        }
    )


def encode(srv: ServerThread, model: str = BERT, **headers: str) -> httpx.Response:
    body = {"inputs": ["the quick brown fox"]}
    return httpx.post(f"{srv.url}/v1/encode/{model}", json=body, headers=headers, timeout=30)


def batches(srv: ServerThread, model: str = BERT) -> tuple[float, float]:
    """Forward batches run for ``model``, and the rows they held."""
    count = metric(srv.url, "fleetserve_batch_size_count", model=model)
    return count, metric(srv.url, "fleetserve_batch_size_sum", model=model)


@pytest.mark.slow
def test_work_pulled_after_its_cancel_is_terminated_unrun(bert_server: ServerThread) -> None:
    srv = bert_server
    assert srv.server is not None
    queue = srv.server.queue
    srv.call(lambda: queue.cancel("early", time.time() + 30))  # before it is even published
    env = dataclasses.replace(_env("early"), deadline=time.time() + 0.5)

    async def publish_and_wait() -> bool:
        pending = await queue.publish(env, b'{"inputs": ["fox"]}')
        try:
            await pending.wait(1.0)
        except DeadlineExceeded:
            return True  # no reply: it was terminated, not run
        return False

    assert srv.call(publish_and_wait)
    assert metric(srv.url, "fleetserve_cancelled_total", model=BERT, where="queued") == 1
    assert batches(srv) == (0, 0)


def test_a_request_waiting_in_the_batch_former_is_dropped(bert_server: ServerThread) -> None:
    srv = bert_server
    gate = block_compute(srv)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(encode, srv)  # taken into a batch that waits for the gate
        assert wait_for(lambda: worker_state(srv) == {"jobs": 1, "loading": 0, "waiting": 0})
        client = Hangup(srv.url, f"/v1/encode/{BERT}", {"inputs": ["gone"]})
        assert wait_for(lambda: worker_state(srv)["waiting"] == 1)  # in the former
        client.close()
        assert wait_for(lambda: metric(srv.url, "fleetserve_cancelled_total", where="batched") == 1)
        assert worker_state(srv) == {"jobs": 1, "loading": 0, "waiting": 1}  # items stay...
        gate.set()
        assert first.result().status_code == 200
    assert encode(srv).status_code == 200
    assert batches(srv) == (2, 2)  # ...but never run: two batches of one row each
    assert metric(srv.url, "fleetserve_requests_total", code="cancelled") == 1


@pytest.mark.slow
def test_a_request_parked_for_its_models_load_is_dropped(bert_server: ServerThread) -> None:
    srv = bert_server
    gate = block_compute(srv)  # the lazy model's warm-up waits for it
    client = Hangup(srv.url, f"/v1/encode/{LAZY}", {"inputs": ["gone"]})
    assert wait_for(lambda: worker_state(srv)["loading"] == 1)
    client.close()
    assert wait_for(
        lambda: metric(srv.url, "fleetserve_cancelled_total", model=LAZY, where="loading") == 1
    )
    assert worker_state(srv)["loading"] == 0  # off the load wait at once
    gate.set()
    assert encode(srv, LAZY).status_code == 200
    assert batches(srv, LAZY) == (1, 1)  # only the second request ran


# -- generation ---------------------------------------------------------------------------
def chat(content: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": CHAT,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


@pytest.fixture
def chat_server(catalog_dir: Path) -> Iterator[ServerThread]:
    with serving(catalog_dir, CHAT) as srv:
        yield srv


def steps(srv: ServerThread) -> float:
    return metric(srv.url, "fleetserve_batch_size_count", model=CHAT)


def test_a_cancelled_sequence_gives_its_slot_to_the_next(chat_server: ServerThread) -> None:
    srv = chat_server
    assert srv.server is not None
    former = srv.server.runners[CHAT].waiting  # one sequence at a time (max_batch_size 1)
    client = Hangup(srv.url, "/v1/chat/completions", chat("hello", LONG, True))
    client.read_until(b'"delta":{"content"')
    with ThreadPoolExecutor(1) as pool:
        body = chat("hi", 4, False)
        waiting = pool.submit(httpx.post, srv.url + "/v1/chat/completions", json=body, timeout=60)
        assert wait_for(lambda: srv.call(lambda: len(former)) == 1)  # waits for the slot
        client.close()
        assert waiting.result().status_code == 200
    assert steps(srv) < LONG / 2  # the first one stopped: it never ran to its end
    assert metric(srv.url, "fleetserve_cancelled_total", where="generating") == 1


def test_a_long_prompt_cancelled_in_its_prefill_stops(chat_server: ServerThread) -> None:
    """End to end; that the engine stops between prefill chunks is in
    ``tests/families/test_prefill.py``."""
    srv = chat_server
    assert srv.server is not None
    runner = srv.server.runners[CHAT]
    # ~3900 prompt tokens in chunks of 16: some 240 prefill steps if nobody stops it
    client = Hangup(srv.url, "/v1/chat/completions", chat("a" * 3900, 8, True))
    client.read_until(b'"role":"assistant"')  # the stream opened: its prefill starts
    client.close()
    assert wait_for(lambda: metric(srv.url, "fleetserve_cancelled_total", model=CHAT) == 1)
    assert wait_for(lambda: srv.call(lambda: runner._live == {}))
    done = steps(srv)
    assert done < 120  # it stopped part way through its prefill
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat("hi", 4, False), timeout=60)
    assert r.status_code == 200 and steps(srv) - done <= 5  # the next one runs alone
