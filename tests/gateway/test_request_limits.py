"""Bodies that cannot be turned against the server (issue 22, findings 6 and 10): deep
nesting is a 400 on every route that decodes a body, too many or too large items a 413
naming the limit, before anything decodes them; X-Request-Timeout is capped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from fleetserve.gateway.request_memory import RequestMemory
from fleetserve.wire import PayloadTooLarge, Unavailable

from ..conftest import TINY, ServerThread, tiny_settings
from ..waiting import wait_for

MP = "application/msgpack"
DEEP = b"[" * 1000 + b"]" * 1000  # 2 KB


def rss() -> int:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def post(srv: ServerThread, path: str, body: bytes, ctype: str = "application/json",
         **headers: str) -> httpx.Response:  # fmt: skip
    return httpx.post(
        srv.url + path, content=body, headers={"content-type": ctype, **headers}, timeout=60
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", b'{"model": "' + TINY.encode() + b'", "input": ' + DEEP + b"}"),
        ("/v1/embeddings", DEEP),
        (f"/v1/encode/{TINY}", b'{"inputs": "x", "adapter": ' + DEEP + b"}"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [], "x": ' + DEEP + b"}"),
        ("/v1/adapters", b'{"name": "a", "config": ' + DEEP + b"}"),
        ("/v1/fine_tuning/jobs", b'{"model": "m", "training_file": ' + DEEP + b"}"),
    ],
)
def test_json_nested_1000_deep_is_a_400(tiny_server: ServerThread, path: str, body: bytes) -> None:
    """Before: a 500 and a RecursionError traceback on each of these routes."""
    r = post(tiny_server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["field"] == "body" and "nested" in err["message"], err


def test_msgpack_nested_deep_is_a_400(tiny_server: ServerThread) -> None:
    """Before: msgpack nested 1000 deep raised RecursionError (a 500)."""
    deep = b"\x91" * 1000 + b"\x90"
    body = b"\x82\xa5model" + msgspec.msgpack.encode(TINY) + b"\xa5input" + deep
    for path, raw in (("/v1/embeddings", body), ("/v1/adapters", b"\x81\xa4name" + deep)):
        r = post(tiny_server, path, raw, MP)
        assert r.status_code == 400, (path, r.text)
        assert "max_nesting_depth" in r.text


def test_a_million_inputs_is_a_quick_413_and_others_are_served_meanwhile(
    tiny_server: ServerThread,
) -> None:
    """Before: 1,000,000 one-word inputs were decoded and tokenized (+1.1 GB of RSS,
    others stalled 24 s). Now a 413 naming max_items, RSS +<100 MiB, /healthz < 1 s."""
    body = msgspec.json.encode({"model": TINY, "input": ["word"] * 1_000_000})
    before = rss()
    done = threading.Event()
    answer: list[httpx.Response] = []

    def attack() -> None:
        try:
            answer.append(post(tiny_server, "/v1/embeddings", body))
        finally:
            done.set()

    threading.Thread(target=attack, daemon=True).start()
    worst = 0.0
    with httpx.Client(timeout=5) as c:
        while not done.is_set():
            t = time.perf_counter()
            assert c.get(tiny_server.url + "/healthz").status_code == 200
            worst = max(worst, time.perf_counter() - t)
    assert worst < 1.0
    r = answer[0]
    assert r.status_code == 413, r.text
    assert r.json()["error"]["field"] == "input" and "max_items" in r.text
    assert rss() - before < 100 * 2**20


def test_one_10mb_string_and_200k_documents_are_413s(tiny_server: ServerThread) -> None:
    """Before: a 10 MB string was tokenized (+778 MiB, a 15 s stall) and 200k rerank
    documents ran to the deadline; now each is a 413 naming the limit."""
    big = msgspec.json.encode({"model": TINY, "input": "word " * 2_000_000})
    r = post(tiny_server, "/v1/embeddings", big)
    assert r.status_code == 413 and "max_item_bytes" in r.text, r.text
    docs = {"model": TINY, "query": "q", "documents": ["a document"] * 200_000}
    for ctype, raw in (("application/json", msgspec.json.encode(docs)),
                       (MP, msgspec.msgpack.encode(docs))):  # fmt: skip
        r = post(tiny_server, "/v1/rerank", raw, ctype, accept="application/json")
        assert r.status_code == 413, r.text
        assert r.json()["error"]["field"] == "documents" and "max_items" in r.text
    one = {"model": TINY, "input": ["ok", "x" * (2 << 20)]}
    r = post(tiny_server, "/v1/embeddings", msgspec.json.encode(one))
    assert r.status_code == 413 and r.json()["error"]["field"] == "input[1]", r.text


def test_models_advertise_the_item_limits(tiny_server: ServerThread) -> None:
    """Before: GET /v1/models said nothing of item limits (the SDK could not chunk
    within them)."""
    limits = httpx.get(tiny_server.url + "/v1/models").json()["data"][0]["limits"]
    assert limits["max_items"] == 2048 and limits["max_item_bytes"] == 1 << 20
    assert limits["max_nesting_depth"] == 64


def test_request_timeout_is_capped_and_must_be_finite(tiny_server: ServerThread) -> None:
    """Before: X-Request-Timeout: 1e300 was taken as a deadline (a request could hold
    the server for ever)."""
    body = msgspec.json.encode({"inputs": ["hello"]})
    path = f"/v1/encode/{TINY}"
    assert post(tiny_server, path, body, **{"x-request-timeout": "1e300"}).status_code == 200
    for bad in ("inf", "nan", "1e400", "-1", "0", "soon"):
        r = post(tiny_server, path, body, **{"x-request-timeout": bad})
        assert r.status_code == 400 and r.json()["error"]["field"] == "x-request-timeout"


def test_parse_timeout_cuts_to_the_maximum() -> None:
    """Before: parse_timeout had no maximum (1e300 came back as 1e300)."""
    from fleetserve.gateway.envelope import parse_timeout

    assert parse_timeout("1e300", 30.0, 3600.0) == 3600.0
    assert parse_timeout(None, 7200.0, 3600.0) == 3600.0
    assert parse_timeout("2.5", 30.0, 3600.0) == 2.5
    assert parse_timeout("1e300", 30.0, 0.0) == 1e300  # 0: no cap


def test_request_memory_reserves_and_refuses() -> None:
    """Before: request buffers were counted nowhere (RSS reached 3.4x the budget)."""
    mem = RequestMemory(1000, factor=4)
    a, b = mem.reservation(), mem.reservation()
    a.grow(200)
    assert mem.held == 800
    with pytest.raises(Unavailable, match="request_memory"):
        b.grow(100)
    with pytest.raises(PayloadTooLarge, match="request_memory"):
        b.grow(300)
    a.release()
    b.grow(100)
    b.grow(150)  # grows to the larger figure, not by it
    assert mem.held == 600
    b.release()
    assert mem.held == 0


def test_a_body_over_the_request_memory_is_a_413(tiny_catalog: Path) -> None:
    """Before: there was no request memory budget at all."""
    srv = ServerThread(tiny_settings(tiny_catalog, request_memory="1MiB")).start()
    try:
        body = msgspec.json.encode({"inputs": ["word " * 70_000]})  # 350 KB: 2.4 MB held
        r = post(srv, f"/v1/encode/{TINY}", body)
        assert r.status_code == 413 and "request_memory" in r.text, r.text
        ok = post(srv, f"/v1/encode/{TINY}", msgspec.json.encode({"inputs": ["hi"]}))
        assert ok.status_code == 200  # and nothing is left held
        assert srv.server is not None
        memory = srv.server.gateway.request_memory
        # released once the reply is sent, which the client may see first under load
        wait_for(lambda: memory.held == 0, 5, lambda: f"held {memory.held} bytes")
    finally:
        srv.stop()


def test_a_training_file_line_nested_deep_is_a_400(tiny_server: ServerThread) -> None:
    """/v1/files (the training file's rows are decoded line by line): before, a 1000-deep
    line was a RecursionError; a 400 naming the line now (pairs.py's own bound)."""
    line = b'{"query": "q", "positive": ' + DEEP + b"}\n"
    r = post(tiny_server, "/v1/files?purpose=fine-tune", line, "application/jsonl")
    assert r.status_code == 400 and r.json()["error"]["field"] == "line 1", r.text


def test_images_are_not_held_to_the_text_item_limit() -> None:
    """An image ({"image": ...}) keeps its model's max_image_bytes (10 MiB by default):
    max_item_bytes is for texts (new: without this, a 3 MiB photo would be a 413)."""
    from fleetserve.gateway.request_limits import RequestLimits
    from fleetserve.wire import Encoding, Task

    limits = RequestLimits()
    photo = {"image": b"\xff" * (3 << 20)}
    for task, body in ((Task.ENCODE, {"inputs": [photo, "a cat"]}),
                       (Task.SCORE, {"query": photo, "items": ["a cat"]})):  # fmt: skip
        limits.check_now(msgspec.msgpack.encode(body), Encoding.MSGPACK, task)
    text = msgspec.msgpack.encode({"inputs": ["a cat", "x" * (3 << 20)]})
    with pytest.raises(PayloadTooLarge, match="max_item_bytes"):
        limits.check_now(text, Encoding.MSGPACK, Task.ENCODE)


def test_a_text_in_an_object_item_is_held_to_the_item_limit() -> None:
    """Before: every {...} item on encode and score passed as if it were an image, so
    {"text": <3 MiB>} got around max_item_bytes; now its text is held to it (an image
    keeps its model's max_image_bytes)."""
    from fleetserve.gateway.request_limits import RequestLimits
    from fleetserve.wire import Encoding, Task

    limits = RequestLimits()
    big = "x" * (3 << 20)
    cases = [
        (Task.ENCODE, {"inputs": [{"text": "a cat"}, {"text": big}]}, "inputs[1].text"),
        (Task.ENCODE, {"inputs": {"text": big}}, "inputs.text"),
        (Task.SCORE, {"query": {"text": big}, "items": ["a cat"]}, "query.text"),
        (Task.SCORE, {"query": "q", "items": [{"text": big}]}, "items[0].text"),
    ]
    for encoding, dump in ((Encoding.MSGPACK, msgspec.msgpack.encode),
                           (Encoding.JSON, msgspec.json.encode)):  # fmt: skip
        for task, body, field in cases:
            with pytest.raises(PayloadTooLarge, match="max_item_bytes") as err:
                limits.check_now(dump(body), encoding, task)
            assert err.value.field == field, (encoding, body.keys())
        photo = {"inputs": [{"image": "A" * (3 << 20)}, {"text": "a cat"}]}  # base64
        limits.check_now(dump(photo), encoding, Task.ENCODE)


@pytest.mark.parametrize("item", ["a", "a longer text " * 10])
def test_item_counts_are_the_same_on_every_path(item: str) -> None:
    """The count is checked however the list is looked at: too short to count, split by
    msgspec (up to SCAN_BYTES) or scanned (larger): 2048 items pass, 2049 do not (new:
    the split path replaced the scan for most lists)."""
    from fleetserve.gateway.request_limits import RequestLimits
    from fleetserve.wire import Encoding, Task

    limits = RequestLimits()
    for n in (1, 2048, 2049):
        body = msgspec.json.encode({"model": "m", "input": [item] * n})
        if n > 2048:
            with pytest.raises(PayloadTooLarge, match="max_items"):
                limits.check_now(body, Encoding.JSON, Task.EMBEDDINGS)
        else:
            limits.check_now(body, Encoding.JSON, Task.EMBEDDINGS)
