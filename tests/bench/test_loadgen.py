"""``run_load`` counts the tokens of the requests that were answered."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetserve.bench.loadgen import run_load


class _Echo(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.send_response(500 if body == b"bad" else 200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def url() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()
    srv.server_close()


def test_tokens_are_those_of_the_answered_requests(url: str) -> None:
    # even requests hold 100 tokens, odd ones 1; every third one fails
    sent: list[int] = []

    def body(i: int) -> bytes:
        return b"bad" if i % 3 == 0 and i > 2 else b"ok"

    def tokens(i: int) -> float:
        sent.append(i)
        return 100.0 if i % 2 == 0 else 1.0

    res = asyncio.run(
        run_load(url, body, {}, concurrency=2, batch=4, tokens_per_item=50.0,
                 duration=0.3, tokens_of=tokens)
    )  # fmt: skip
    ok = [i for i in sent if not (i % 3 == 0 and i > 2)]
    assert sent == ok  # failed requests are never counted
    want = sum(100.0 if i % 2 == 0 else 1.0 for i in ok)
    assert res.tokens_per_s == pytest.approx(want / res.seconds)
    assert res.errors > 0 and res.requests == len(ok)


def test_without_tokens_of_a_request_counts_batch_times_the_mean(url: str) -> None:
    res = asyncio.run(
        run_load(url, lambda i: b"ok", {}, concurrency=1, batch=4, tokens_per_item=10.0,
                 duration=0.2)
    )  # fmt: skip
    assert res.tokens_per_s == pytest.approx(res.requests * 40.0 / res.seconds)
