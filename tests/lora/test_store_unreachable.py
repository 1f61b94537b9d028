"""The adapter store over NATS while NATS is away: a 503 to retry, never a 500.

A soak (``python -m benchmarks soak``) restarting nats-server found the gateway's
adapter lookup failing with ``nats: timeout`` as an internal error.
"""

from __future__ import annotations

from typing import Any

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NotFoundError

from fleetserve.lora.store import AdapterStore
from fleetserve.wire import Unavailable


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
    store = AdapterStore(NatsObjectStore(exc))  # type: ignore[arg-type]
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
