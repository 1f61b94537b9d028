"""The chunk plan, the limits the SDK reads, and long calls at the protocol boundary
(mocked): the fallback when /v1/models says nothing, one look-up per client, how each
task's chunks join, and the priority header."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

import fleetserve
from fleetserve import AsyncClient, Client
from fleetserve.sdk import Quantized, RerankResult
from fleetserve.sdk._chunks import (
    BATCHES,
    SMALL_ITEMS,
    Limits,
    limits_by_model,
    plan,
    shifted,
    sizes_if_large,
)
from fleetserve.wire import Encoding
from fleetserve.wire.codec import array_to_wire, dumps, loads

MP = "application/msgpack"


def test_plan_keeps_each_chunk_within_every_budget() -> None:
    big = 10**6
    # a few batches of items
    assert plan([10] * 10, Limits(big, big, 3, 512), 10, 0) == [(0, 6), (6, 10)]
    # half the body, less the rest of it (10 bytes): 90 bytes
    assert plan([30] * 4, Limits(200, big, 100, 512), 10, 0) == [(0, 3), (3, 4)]
    # 2 batches of 20 tokens; 24 bytes would be 10 tokens, but max_seq_len truncates to 8
    assert plan([24] * 6, Limits(big, 20, 100, 8), 0, 0) == [(0, 5), (5, 6)]
    # 9 bytes are 5 tokens, and the query's 5 more with each item
    assert plan([9] * 10, Limits(big, 20, 100, 512), 0, 5) == [(0, 4), (4, 8), (8, 10)]
    # an item too large alone goes alone, for the server to refuse
    assert plan([500, 1, 500], Limits(200, big, 100, 512), 0, 0) == [(0, 1), (1, 2), (2, 3)]
    assert plan([], Limits(), 0, 0) == []


def test_small_calls_go_whole_without_a_look_up() -> None:
    assert sizes_if_large(None) is None
    assert sizes_if_large(["x"] * SMALL_ITEMS) is None
    assert sizes_if_large(["x" * 70_000]) == [70_005]  # planned: it goes alone
    assert sizes_if_large(["é"] * (SMALL_ITEMS + 1)) == [7] * (SMALL_ITEMS + 1)
    assert sizes_if_large([b"abc", "x" * 40_000, "y" * 40_000]) == [8, 40_005, 40_005]


def test_limits_read_what_is_there_and_default_the_rest() -> None:
    body = {
        "data": [
            {"id": "a", "limits": {"max_body_bytes": 1000, "max_batch_size": 0}},
            {"id": "b", "limits": {"max_seq_len": True, "max_batch_tokens": "9"}},
            {"id": "c"},
            "junk",
        ]
    }
    got = limits_by_model(body)
    assert got["a"] == Limits(max_body_bytes=1000)
    assert got["b"] == got["c"] == Limits()
    assert limits_by_model({"data": None}) == limits_by_model([]) == {}


def test_a_chunk_error_names_the_item_in_the_whole_list() -> None:
    err = fleetserve.InvalidInput("inputs[3] is an empty string", field="inputs[3]")
    moved = shifted(err, "inputs", 200)
    assert type(moved) is fleetserve.InvalidInput
    assert (moved.field, moved.message) == ("inputs[203]", "inputs[203] is an empty string")
    deep = shifted(fleetserve.InvalidInput("bad", field="items[1].text"), "items", 5)
    assert deep.field == "items[6].text"
    other = fleetserve.InvalidInput("no", field="labels[1]")
    assert shifted(other, "inputs", 9) is other
    assert shifted(err, "inputs", 0) is err


# -- a mocked server that answers each item with its number ---------------------------


def reply(body: object) -> httpx.Response:
    return httpx.Response(200, content=dumps(body, Encoding.MSGPACK), headers={"content-type": MP})


class Echo:
    """Answers every task by item: ``"t17"`` is item 17; records what it was sent."""

    def __init__(self, models: object = None) -> None:
        self.models = models
        self.requests: list[httpx.Request] = []

    def bodies(self) -> list[Any]:
        return [loads(r.content, Encoding.MSGPACK) for r in self.requests if r.method == "POST"]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "GET":
            if self.models is None:
                return httpx.Response(404, json={"error": {"code": "not_found", "message": "x"}})
            return httpx.Response(200, json=self.models)
        body = loads(request.content, Encoding.MSGPACK)
        items = body.get("inputs") or body.get("items") or body.get("documents")
        if "" in items:
            i = items.index("")
            bad = {"code": "invalid_input", "message": f"inputs[{i}] is empty"}
            return httpx.Response(400, json={"error": {**bad, "field": f"inputs[{i}]"}})
        nums = [float(t[1:]) for t in items]
        path = request.url.path
        if path.startswith("/v1/encode") and body.get("output_dtype") == "int8":
            values = np.array([[n % 100, 1] for n in nums], np.int8)
            scales = array_to_wire(np.array(nums, np.float32))
            return reply({"embeddings": array_to_wire(values), "scales": scales,
                          "output_dtype": "int8", "dimensions": 2})  # fmt: skip
        if path.startswith("/v1/encode"):
            return reply({"embeddings": array_to_wire(np.array([[n, 0] for n in nums], "f4"))})
        if path.startswith("/v1/score"):
            return reply({"scores": nums})
        if path.startswith("/v1/extract"):
            return reply({"results": [[{"label": str(int(n))}] for n in nums]})
        ranked = sorted(range(len(nums)), key=lambda i: -(nums[i] % 7))[: body.get("top_n")]
        return reply({"results": [{"index": i, "relevance_score": nums[i] % 7} for i in ranked]})


TEXTS = [f"t{i}" for i in range(300)]
PER_CHUNK = BATCHES * Limits().max_batch_size  # what the defaults allow of short items


def client(echo: Echo, **kw: Any) -> Client:
    return Client("http://fleet.test", transport=httpx.MockTransport(echo), **kw)


def test_without_advertised_limits_the_defaults_apply_and_are_fetched_once() -> None:
    echo = Echo()  # /v1/models: 404
    with client(echo) as c:
        emb = c.encode("m", TEXTS)
        c.encode("m", TEXTS)
    np.testing.assert_array_equal(emb[:, 0], np.arange(300))
    assert [r.method for r in echo.requests].count("GET") == 1
    # chunks go out in parallel, so they may arrive in any order
    first_call = sorted(len(b["inputs"]) for b in echo.bodies()[:3])
    assert first_call == [300 - 2 * PER_CHUNK, PER_CHUNK, PER_CHUNK]


def test_advertised_limits_size_the_chunks() -> None:
    limits = {"max_batch_size": 10, "max_body_bytes": 1 << 20}
    echo = Echo({"data": [{"id": "org/m", "limits": limits}]})
    with client(echo) as c:
        c.encode("org/m:tenant/lora", TEXTS)  # an adapter call: the base's limits
    assert {len(b["inputs"]) for b in echo.bodies()} == {BATCHES * 10}
    assert {r.url.path for r in echo.requests if r.method == "POST"} == {
        "/v1/encode/org/m:tenant/lora"
    }


def test_every_task_joins_its_chunks_in_input_order() -> None:
    echo = Echo()
    with client(echo) as c:
        q = c.encode("m", TEXTS, output_dtype="int8")
        assert isinstance(q, Quantized) and q.scales is not None
        np.testing.assert_array_equal(q.scales, np.arange(300))
        assert q.values.shape == (300, 2)
        assert c.score("m", "q", TEXTS) == [float(i) for i in range(300)]
        found = c.extract("m", TEXTS, labels=["x"])
        assert [r[0]["label"] for r in found] == [str(i) for i in range(300)]
        every = c.rerank("m", "q", TEXTS)
        top = c.rerank("m", "q", TEXTS, top_n=5)
    want = sorted(range(300), key=lambda i: (-(i % 7), i))
    assert [r.index for r in every] == want
    assert top == [RerankResult(i, float(i % 7)) for i in want[:5]]
    assert all(b.get("top_n") == 5 for b in echo.bodies()[-3:])


def test_a_failed_chunk_fails_the_call() -> None:
    echo = Echo()
    texts = [*TEXTS[:150], "", *TEXTS[151:]]
    with client(echo, max_in_flight=1) as c, pytest.raises(fleetserve.InvalidInput) as info:
        c.extract("m", texts)
    assert info.value.field == "inputs[150]"
    assert len(echo.bodies()) == 2  # one at a time: the third was never sent


def test_priority_is_sent_and_checked() -> None:
    echo = Echo()
    with client(echo) as c:
        c.encode("m", ["t1"], priority="interactive")
        c.encode("m", ["t1"])
        c.encode("m", TEXTS)  # a split call is bulk work
        with pytest.raises(fleetserve.InvalidInput) as info:
            c.encode("m", ["t1"], priority="urgent")
    assert info.value.field == "priority" and "interactive" in info.value.message
    posts = [r for r in echo.requests if r.method == "POST"]
    assert posts[0].headers["x-priority"] == "interactive"
    assert "x-priority" not in posts[1].headers
    assert {r.headers["x-priority"] for r in posts[2:]} == {"batch"}
    with client(Echo(), priority="INTERACTIVE") as c:
        assert c.priority == "interactive"
    with pytest.raises(fleetserve.InvalidInput):
        client(Echo(), priority="soon")


async def test_async_client_chunks_and_sends_priority() -> None:
    echo = Echo()
    transport = httpx.MockTransport(echo)
    async with AsyncClient("http://fleet.test", transport=transport, priority="batch") as c:
        emb = await c.encode("m", TEXTS)
        scores = await c.score("m", "q", TEXTS[:3], priority="interactive")
    np.testing.assert_array_equal(emb[:, 0], np.arange(300))
    assert scores == [0.0, 1.0, 2.0]
    posts = [r for r in echo.requests if r.method == "POST"]
    assert [r.headers["x-priority"] for r in posts] == ["batch"] * 3 + ["interactive"]


def test_chunks_stay_within_the_advertised_max_items() -> None:
    """Before, the SDK read no max_items: with a large batch size it sent chunks of 200
    items to a server that takes 7 (each a 413)."""
    assert plan([1] * 20, Limits(10**6, 10**6, 100, 512, max_items=7), 0, 0) == [
        (0, 7),
        (7, 14),
        (14, 20),
    ]
    limits = {"max_batch_size": 100, "max_body_bytes": 1 << 20, "max_items": 7}
    echo = Echo({"data": [{"id": "m", "limits": limits}]})
    with client(echo) as c:
        emb = c.encode("m", TEXTS)
    np.testing.assert_array_equal(emb[:, 0], np.arange(300))
    assert max(len(b["inputs"]) for b in echo.bodies()) == 7
