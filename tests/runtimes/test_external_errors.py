"""How the external runtime maps the model server's failures to fleetserve errors."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from fleetserve.runtimes import Output, SamplingParams
from fleetserve.runtimes.external import ExternalRuntime
from fleetserve.wire import (
    DeadlineExceeded,
    FleetError,
    InternalError,
    InvalidInput,
    Overloaded,
    Unavailable,
)

from .standin import StandIn

PARAMS = SamplingParams(max_tokens=4)
PATHS = {"sglang": "/generate", "openai": "/v1/completions"}

Make = Callable[..., ExternalRuntime]


@pytest.fixture(scope="module")
def server() -> Iterator[StandIn]:
    with StandIn() as srv:
        yield srv


@pytest.fixture
def runtime() -> Iterator[Make]:
    made: list[ExternalRuntime] = []

    def make(srv: StandIn, **options: Any) -> ExternalRuntime:
        rt = ExternalRuntime(options={"url": srv.url, **options})
        made.append(rt)
        rt.load(None)
        return rt

    yield make
    for rt in made:
        rt.close()


@pytest.mark.parametrize("api", ["sglang", "openai"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, InvalidInput),
        (422, InvalidInput),
        (404, InternalError),
        (429, Overloaded),
        (500, InternalError),
        (503, Unavailable),
    ],
)
def test_status_mapping(
    server: StandIn,
    api: str,
    stream: bool,
    status: int,
    error: type[FleetError],
    runtime: Make,
) -> None:
    rt = runtime(server, api=api)
    server.fail(PATHS[api], status, "prompt is too long for this model")
    with pytest.raises(error) as info:
        rt.generate([1, 2], PARAMS, (lambda _: None) if stream else None)
    assert type(info.value) is error
    assert "prompt is too long for this model" in info.value.message
    if status >= 500 or status == 404:
        assert server.url in info.value.message  # names the server it could not use
    rt.generate([1, 2], PARAMS)  # the fault was one-shot; the runtime still works


def test_embeddings_error_carries_the_server_message(server: StandIn, runtime: Make) -> None:
    rt = runtime(server, api="openai")
    server.fail("/v1/embeddings", 400, "input is longer than 512 tokens")
    with pytest.raises(InvalidInput, match="input is longer than 512 tokens"):
        rt.run(np.ones((1, 3), np.int64), np.ones((1, 3), np.int64), Output.CLS)


@pytest.mark.parametrize("api", ["sglang", "openai"])
@pytest.mark.parametrize("stream", [False, True])
def test_dropped_connection_is_unavailable(
    server: StandIn, api: str, stream: bool, runtime: Make
) -> None:
    rt = runtime(server, api=api)
    server.drop(PATHS[api])
    with pytest.raises(Unavailable, match="dropped the connection") as info:
        rt.generate([1], PARAMS, (lambda _: None) if stream else None)
    assert info.value.retry_after == 2.0


@pytest.mark.parametrize(
    ("api", "code", "error"),
    [("sglang", 0, InvalidInput), ("openai", 400, InvalidInput), ("openai", 500, InternalError)],
)
def test_error_event_inside_a_stream(
    server: StandIn, api: str, code: int, error: type[FleetError], runtime: Make
) -> None:
    rt = runtime(server, api=api)
    server.stream_error(PATHS[api], "grammar compilation failed", code=code)
    seen: list[str] = []
    with pytest.raises(error, match="grammar compilation failed"):
        rt.generate([1], SamplingParams(max_tokens=6), seen.append)
    assert len(seen) == 1  # the text before the error was already delivered


def test_timeout_is_deadline_exceeded(server: StandIn, runtime: Make) -> None:
    rt = runtime(server, timeout=0.2)
    server.delay = 1.0
    try:
        with pytest.raises(DeadlineExceeded, match=r"did not answer within 0.2 s"):
            rt.generate([1], PARAMS)
    finally:
        server.delay = 0.0


def test_unreachable_server_names_the_url() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    for api in ("sglang", "openai"):
        with ExternalRuntime(options={"url": url, "api": api, "retry_after": 5}) as rt:
            with pytest.raises(Unavailable, match=f"cannot reach the model server at {url}") as e:
                rt.load(None)
            assert e.value.retry_after == 5
            with pytest.raises(Unavailable, match=url):
                rt.generate([1], PARAMS, lambda _: None)


def test_wrong_model_or_key_is_a_setup_error(runtime: Make) -> None:
    with StandIn(api_key="right") as srv:
        with pytest.raises(InternalError, match="answered 401"):
            runtime(srv, api="openai", api_key="wrong")
        with pytest.raises(InternalError, match=r"serves \['stand-in/model'\], not 'other'"):
            runtime(srv, api="openai", api_key="right", model="other")
