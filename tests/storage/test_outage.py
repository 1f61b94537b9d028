"""A store that is away: a 503 naming the kind of failure, never the store's text."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from fleetserve.logs.context import for_request
from fleetserve.storage import FileStore, MemoryStore, PayloadMissing
from fleetserve.storage.offload import Offload
from fleetserve.storage.outage import is_outage, kind_of, unreachable
from fleetserve.storage.s3 import S3Store
from fleetserve.wire import Unavailable


def closed_s3() -> tuple[S3Store, int]:
    """S3 at a loopback port nothing listens on (static keys: no metadata look-up)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    store = S3Store(
        "payloads",
        endpoint=f"http://127.0.0.1:{port}",
        access_key_id="test-id",
        secret_access_key="test-secret",
        timeout=2.0,
        max_retries=0,
        retry_timeout=2.0,
    )
    return store, port


async def test_a_payload_store_away_is_a_503_and_its_text_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A big body's put to an unreachable S3 raised obstore's GenericError (a 500, its
    text naming the URL); now Unavailable, with the text and request id in the log."""
    store, port = closed_s3()
    offload = Offload(store, threshold=1)
    with caplog.at_level(logging.WARNING, logger="fleetserve.storage"):
        for what, call in (
            ("stash", lambda: offload.stash("rid-big", "in", b"x" * 10)),
            ("load", lambda: offload.load("req/rid-big-in")),
        ):
            caplog.clear()
            with for_request(f"rid-{what}"), pytest.raises(Unavailable) as info:
                await call()
            msg = info.value.message
            assert msg == "the payload store is unreachable (GenericError); retry", msg
            assert "127.0.0.1" not in msg and str(port) not in msg
            assert f"rid-{what}" in caplog.text and f"127.0.0.1:{port}" in caplog.text
    assert await offload.stash("rid-small", "in", b"") is None  # under the threshold


async def test_a_missing_payload_is_no_outage(tmp_path: Path) -> None:
    with pytest.raises(PayloadMissing):
        await Offload(FileStore(tmp_path)).load("req/none-in")


def test_what_counts_as_an_outage(tmp_path: Path) -> None:
    from obstore.exceptions import GenericError, NotFoundError

    assert [kind_of(MemoryStore()), kind_of(FileStore(tmp_path)), kind_of(object())] == [
        "memory",
        "file",
        "other",
    ]
    assert kind_of(closed_s3()[0]) == "s3"
    assert is_outage("file", PermissionError("/srv/store/x")) and is_outage("s3", GenericError())
    assert not is_outage("file", FileNotFoundError()) and not is_outage("s3", NotFoundError())
    assert not is_outage("s3", PayloadMissing("k", "s3://b")) and not is_outage("memory", OSError())
    with pytest.raises(ValueError), unreachable("payload store", "file", "file:///x"):
        raise ValueError("a bad key is the caller's")


async def test_an_outage_carries_the_retry_after_setting_it_was_opened_with(
    tmp_path: Path,
) -> None:
    """Before, every store outage said Retry-After 1.0 whatever retry_after was set to."""
    from fleetserve.lora.store import open_adapter_store
    from fleetserve.settings import Settings

    class Away(FileStore):
        async def get(self, key: str) -> bytes:
            raise PermissionError(f"{self.root}/{key}")

    with pytest.raises(Unavailable) as info:
        await Offload(Away(tmp_path), retry_after=7.0).load("req/a-in")
    assert info.value.retry_after == 7.0
    settings = Settings(retry_after=4.0, adapter_store=(tmp_path / "adapters").as_uri())
    adapters = await open_adapter_store(settings)
    assert adapters.retry_after == 4.0


def test_one_kind_and_one_nats_outage_rule_for_every_store(tmp_path: Path) -> None:
    """Before, kind_of called a FileStore subclass 'other' (no outage ever) while the
    adapter store's own copy called it 'file'; and the queue had a third, broader test
    of a NATS outage than the stores."""
    from nats.errors import NoServersError
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import NotFoundError

    from fleetserve.storage.outage import is_nats_outage

    class Mine(FileStore):
        pass

    assert kind_of(Mine(tmp_path)) == "file" and is_outage("file", PermissionError())
    for exc in (NatsTimeout(), NoServersError(), TimeoutError(), ConnectionResetError()):
        assert is_nats_outage(exc) and is_outage("nats", exc)
    assert not is_nats_outage(NotFoundError()) and not is_nats_outage(ValueError())
