"""fleetserve.Client and AsyncClient: a real server, typed errors, timeouts and retries."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest

import fleetserve
from fleetserve import AsyncClient, Client
from fleetserve.wire import Encoding
from fleetserve.wire.codec import array_to_wire, dumps, loads

from ..conftest import TINY, ServerThread

MP = "application/msgpack"


# -- against the real tiny server ------------------------------------------------------


@pytest.fixture
def client(tiny_server: ServerThread) -> Iterator[Client]:
    with Client(tiny_server.url, max_retries=0) as c:
        yield c


def test_encode_returns_normalized_float32_rows(client: Client, tiny_server: ServerThread) -> None:
    emb = client.encode(TINY, ["hello world", "the quick fox"])
    assert isinstance(emb, np.ndarray)
    assert emb.shape == (2, 32) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    via_json = httpx.post(
        f"{tiny_server.url}/v1/encode/{TINY}", json={"inputs": ["hello world", "the quick fox"]}
    ).json()
    np.testing.assert_allclose(emb, via_json["embeddings"], atol=1e-6)


def test_encode_single_string_float16_and_dimensions(client: Client) -> None:
    one = client.encode(TINY, "fox")
    assert one.shape == (1, 32) and one.dtype == np.float32
    half = client.encode(TINY, ["fox", "dog"], output_dtype="float16")
    assert half.shape == (2, 32) and half.dtype == np.float16
    np.testing.assert_allclose(half[0].astype(np.float32), one[0], atol=2e-3)
    cut = client.encode(TINY, ["fox"], dimensions=8, output_dtype="float16")
    assert cut.shape == (1, 8) and cut.dtype == np.float16


async def test_async_client_matches_the_sync_client(tiny_server: ServerThread) -> None:
    with Client(tiny_server.url) as sync:
        want = sync.encode(TINY, ["river bank", "money"])
    async with AsyncClient(tiny_server.url) as c:
        got = await c.encode(TINY, ["river bank", "money"])
        half = await c.encode(TINY, "water", output_dtype="float16")
    assert got.shape == (2, 32) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert half.shape == (1, 32) and half.dtype == np.float16


@pytest.mark.parametrize(
    ("texts", "options", "field"),
    [
        ([], {}, "inputs"),
        ([""], {}, "inputs[0]"),
        (["x"], {"normalize": "yes"}, "normalize"),
        (["x"], {"dimensions": 33}, "dimensions"),
    ],
)
def test_invalid_input_is_typed_and_names_the_field(
    client: Client, texts: list[str], options: dict[str, object], field: str
) -> None:
    with pytest.raises(fleetserve.InvalidInput) as info:
        client.encode(TINY, texts, **options)
    assert info.value.field == field and info.value.code == "invalid_input"


async def test_unknown_model_is_model_not_found(tiny_server: ServerThread) -> None:
    with Client(tiny_server.url) as c, pytest.raises(fleetserve.ModelNotFound) as info:
        c.encode("no/such-model", ["x"])
    assert "no/such-model" in info.value.message
    async with AsyncClient(tiny_server.url) as ac:
        with pytest.raises(fleetserve.ModelNotFound):
            await ac.encode("no/such-model", ["x"])


@pytest.fixture
def blocked(tiny_server: ServerThread) -> Iterator[threading.Event]:
    """Hold the tiny model's forward thread so that requests wait."""
    assert tiny_server.server is not None
    gate = threading.Event()
    tiny_server.server.runners[TINY]._forward.submit(gate.wait, 30)
    yield gate
    gate.set()


def test_timeout_is_deadline_exceeded(client: Client, blocked: threading.Event) -> None:
    t0 = time.monotonic()
    with pytest.raises(fleetserve.DeadlineExceeded):
        client.encode(TINY, ["slow fox"], timeout=0.3)
    assert time.monotonic() - t0 < 5.0
    blocked.set()
    assert client.encode(TINY, ["fast fox"]).shape == (1, 32)


async def test_async_timeout_is_deadline_exceeded(
    tiny_server: ServerThread, blocked: threading.Event
) -> None:
    async with AsyncClient(tiny_server.url, max_retries=0) as c:
        with pytest.raises(fleetserve.DeadlineExceeded):
            await c.encode(TINY, ["slow fox"], timeout=0.3)


async def test_client_level_timeout_is_the_server_deadline(
    tiny_server: ServerThread, blocked: threading.Event
) -> None:
    t0 = time.monotonic()
    async with AsyncClient(tiny_server.url, timeout=0.3, max_retries=0) as c:
        with pytest.raises(fleetserve.DeadlineExceeded):
            await c.encode(TINY, ["slow fox"])
    assert time.monotonic() - t0 < 1.2  # the server's 504, not the client's read timeout


def test_unreachable_server_is_unavailable_and_named() -> None:
    with (
        Client("http://127.0.0.1:9", max_retries=0) as c,
        pytest.raises(fleetserve.Unavailable) as info,
    ):
        c.encode(TINY, ["x"])
    assert "cannot reach the server at http://127.0.0.1:9: " in info.value.message


# -- the protocol boundary, mocked -----------------------------------------------------


def ok_reply(n: int = 1, dim: int = 4) -> httpx.Response:
    arr = np.arange(n * dim, dtype=np.float32).reshape(n, dim)
    body = {"embeddings": array_to_wire(arr), "usage": {"tokens": n}}
    return httpx.Response(200, content=dumps(body, Encoding.MSGPACK), headers={"content-type": MP})


def error_reply(status: int, code: str, retry_after: str | None = "0") -> httpx.Response:
    body = {"error": {"code": code, "message": f"{code} now", "field": None}}
    headers = {"content-type": "application/json"}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return httpx.Response(status, content=dumps(body, Encoding.JSON), headers=headers)


class Script:
    """A MockTransport handler that answers from a list and records the requests."""

    def __init__(self, *responses: Callable[[], httpx.Response]) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.responses[min(len(self.requests), len(self.responses)) - 1]()


def sync_client(script: Script, **kw: float) -> Client:
    return Client("http://fleet.test", transport=httpx.MockTransport(script), **kw)  # type: ignore[arg-type]


def async_client(script: Script, **kw: float) -> AsyncClient:
    return AsyncClient("http://fleet.test", transport=httpx.MockTransport(script), **kw)  # type: ignore[arg-type]


def test_request_shape() -> None:
    script = Script(ok_reply)
    with sync_client(script) as c:
        c.encode("org/model name", ["a", "b"], timeout=2, normalize=False)
    [req] = script.requests
    assert req.method == "POST"
    assert req.url.raw_path == b"/v1/encode/org/model%20name"
    assert req.headers["content-type"] == MP and req.headers["accept"] == MP
    assert float(req.headers["x-request-timeout"]) == 2.0
    assert loads(req.content, Encoding.MSGPACK) == {"inputs": ["a", "b"], "normalize": False}


@pytest.mark.parametrize(("status", "code"), [(503, "unavailable"), (429, "overloaded")])
def test_retries_then_succeeds(status: int, code: str) -> None:
    script = Script(
        lambda: error_reply(status, code), lambda: error_reply(status, code), lambda: ok_reply(2)
    )
    with sync_client(script, max_retries=3) as c:
        emb = c.encode("m", ["a", "b"])
    assert len(script.requests) == 3
    assert emb.shape == (2, 4) and emb.dtype == np.float32
    # the client-level timeout travels as the server-side deadline
    assert script.requests[0].headers["x-request-timeout"] == "30.0"


@pytest.mark.parametrize(
    ("status", "code", "exc"),
    [(503, "unavailable", fleetserve.Unavailable), (429, "overloaded", fleetserve.Overloaded)],
)
def test_retries_exhausted_raise_the_typed_error(
    status: int, code: str, exc: type[fleetserve.FleetError]
) -> None:
    script = Script(lambda: error_reply(status, code))
    with sync_client(script, max_retries=2) as c, pytest.raises(exc) as info:
        c.encode("m", ["a"])
    assert len(script.requests) == 3
    assert info.value.retry_after == 0.0


def test_non_retryable_errors_are_not_retried() -> None:
    script = Script(lambda: error_reply(400, "invalid_input", retry_after=None), ok_reply)
    with sync_client(script, max_retries=3) as c, pytest.raises(fleetserve.InvalidInput):
        c.encode("m", ["a"])
    assert len(script.requests) == 1


def test_retry_after_is_honoured_up_to_the_timeout() -> None:
    script = Script(lambda: error_reply(503, "unavailable", "0.15"), ok_reply)
    with sync_client(script, max_retries=1) as c:
        t0 = time.monotonic()
        c.encode("m", ["a"])
        assert time.monotonic() - t0 >= 0.14
    # a server that says when (a quick tune's estimate), past max_backoff: waited for
    script = Script(lambda: error_reply(503, "unavailable", "1.5"), ok_reply)
    with sync_client(script, max_retries=1, max_backoff=0.01, timeout=5) as c:
        t0 = time.monotonic()
        c.encode("m", ["a"])
        assert time.monotonic() - t0 >= 1.5
    # one that says more than the call has left: answered now, with the estimate
    script = Script(lambda: error_reply(429, "overloaded", "3600"), ok_reply)
    with sync_client(script, max_retries=1) as c, pytest.raises(fleetserve.Overloaded) as info:
        t0 = time.monotonic()
        c.encode("m", ["a"], timeout=2)
    assert time.monotonic() - t0 < 1.0 and info.value.retry_after == 3600.0
    assert len(script.requests) == 1


def test_non_fleet_error_body_is_internal_error() -> None:
    script = Script(lambda: httpx.Response(502, text="<html>bad gateway</html>"))
    with sync_client(script) as c, pytest.raises(fleetserve.InternalError) as info:
        c.encode("m", ["a"])
    assert "502" in info.value.message


async def test_async_retries_then_succeeds_or_exhausts() -> None:
    script = Script(
        lambda: error_reply(503, "unavailable"), lambda: error_reply(503, "unavailable"), ok_reply
    )
    async with async_client(script, max_retries=2) as c:
        emb = await c.encode("m", "a")
    assert len(script.requests) == 3 and emb.shape == (1, 4)
    script = Script(lambda: error_reply(429, "overloaded"))
    async with async_client(script, max_retries=1) as c:
        with pytest.raises(fleetserve.Overloaded):
            await c.encode("m", "a")
    assert len(script.requests) == 2
