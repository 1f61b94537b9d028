"""The adapter store while its backend (NATS, S3) is away: a 503 to retry, never a
500, naming the kind of failure but none of its internals (hosts, URLs), which the log
keeps with the request id.

A soak (``python -m benchmarks soak``) restarting nats-server found the gateway's
adapter lookup failing with ``nats: timeout`` as an internal error.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NotFoundError

from fleetserve.logs.context import for_request
from fleetserve.lora.store import AdapterStore
from fleetserve.storage import FileStore, PayloadMissing
from fleetserve.storage.s3 import S3Store
from fleetserve.wire import Unavailable
from tests.conftest import TINY, ServerThread, tiny_settings
from tests.lora.test_serving import upload
from tests.tiny_lora import make_lora


class NatsObjectStore:
    """Stands in for storage.nats.NatsObjectStore (the store's kind is its class name)."""

    url = "nats://fake"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def _bound(self) -> Any:
        raise self.exc

    async def get(self, key: str) -> bytes:
        raise self.exc

    async def put(self, key: str, data: bytes) -> None:
        raise self.exc

    async def delete(self, key: str) -> None:
        raise self.exc


@pytest.mark.parametrize("exc", [NatsTimeout(), NoRespondersError()])
async def test_nats_away_is_unavailable_with_retry_after(exc: Exception) -> None:
    store = AdapterStore(NatsObjectStore(exc), retry_after=1.0)  # type: ignore[arg-type]
    for call in (
        store.keys("default/a"),
        store.get("k"),
        store.put("k", b"x"),
        store.delete("k"),
        store.create("k", b"x"),
    ):
        with pytest.raises(Unavailable) as info:
            await call
        assert info.value.retry_after == 1.0 and type(exc).__name__ in info.value.message


async def test_other_nats_errors_pass_through() -> None:
    store = AdapterStore(NatsObjectStore(NotFoundError()))  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        await store.get("k")


# -- S3 away: the caller hears which kind of failure, the log has the rest -------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _s3_away() -> tuple[AdapterStore, int]:
    """An adapter store on S3 at a loopback port nothing listens on (static keys: no
    look-up of the cloud's metadata address)."""
    port = _closed_port()
    s3 = S3Store(
        "adapters",
        endpoint=f"http://127.0.0.1:{port}",
        access_key_id="test-id",
        secret_access_key="test-secret",
        timeout=2.0,
        max_retries=0,
        retry_timeout=2.0,
    )
    return AdapterStore(s3, retry_after=1.0), port  # the setting, as opened


def _no_internals(message: str, port: int) -> None:
    assert message == "the adapter store is unreachable (GenericError); retry", message
    for internal in ("127.0.0.1", str(port), "http", "adapters/"):
        assert internal not in message


async def test_s3_away_is_unavailable_and_logged_in_full(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """obstore's GenericError (its text names the URL it tried) passed through raw: a
    500 to the caller. Now a 503 naming the failure's kind only; the log has the text
    and the request it failed."""
    store, port = _s3_away()
    with caplog.at_level(logging.WARNING, logger="fleetserve.storage"):
        for i, call in enumerate(
            (
                lambda: store.keys("default/a"),
                lambda: store.get("k"),
                lambda: store.put("k", b"x"),
                lambda: store.delete("k"),
                lambda: store.create("k", b"x"),
            )
        ):
            caplog.clear()
            with for_request(f"req-{i}"), pytest.raises(Unavailable) as info:
                await call()
            assert info.value.retry_after == 1.0
            _no_internals(info.value.message, port)
            logged = caplog.text
            assert f"req-{i}" in logged and f"127.0.0.1:{port}" in logged, logged


async def test_a_missing_key_is_no_outage(tmp_path: Path) -> None:
    store = AdapterStore(FileStore(tmp_path))
    with pytest.raises(PayloadMissing):
        await store.get("default/none")
    assert await store.keys("default/") == []
    assert await store.create("default/a", b"1") and not await store.create("default/a", b"2")


def test_the_gateway_answers_503_without_the_store_internals(
    tiny_catalog: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the HTTP API: the adapter list and an upload while S3 is away were 500s
    before; now 503s with Retry-After, their text and the request id in the log."""
    settings = tiny_settings(
        tiny_catalog, cache_dir=str(tmp_path / "cache"), adapter_store=(tmp_path / "a").as_uri()
    )
    srv = ServerThread(settings).start()
    try:
        assert srv.server is not None and srv.server.adapters is not None
        lora = make_lora(tiny_catalog.parent / "model", tmp_path / "lora", seed=1)
        aid = upload(srv.url, lora, "before").json()["id"]  # known, never fetched yet
        store, port = _s3_away()
        srv.server.adapters.registry.store = store
        with caplog.at_level(logging.WARNING, logger="fleetserve.storage"):
            r = httpx.get(
                f"{srv.url}/v1/adapters", headers={"x-request-id": "list-while-away"}, timeout=30
            )
            up = upload(srv.url, lora, "n", **{"x-request-id": "upload-while-away"})
            call = httpx.post(
                f"{srv.url}/v1/encode/{TINY}",
                json={"inputs": ["x"], "adapter": aid},
                headers={"x-request-id": "call-while-away"},
                timeout=30,
            )
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "unavailable"
        _no_internals(r.json()["error"]["message"], port)
        assert "list-while-away" in caplog.text and f"127.0.0.1:{port}" in caplog.text
        assert up.status_code == 503, up.text
        _no_internals(up.json()["error"]["message"], port)
        assert "upload-while-away" in caplog.text
        assert call.status_code == 503, call.text  # its files are fetched on first use
        _no_internals(call.json()["error"]["message"], port)
        assert "call-while-away" in caplog.text
    finally:
        srv.stop()
