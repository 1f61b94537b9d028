"""With an API key set, /v1/* needs 'Authorization: Bearer <key>'; health stays open."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import fleetserve

from ..conftest import TINY, ServerThread, tiny_settings


@pytest.fixture(scope="module")
def keyed_server(tiny_catalog: Path) -> Iterator[ServerThread]:
    srv = ServerThread(tiny_settings(tiny_catalog, api_key="s3cret")).start()
    yield srv
    srv.stop()


def test_missing_or_wrong_key_is_401(keyed_server: ServerThread) -> None:
    url = f"{keyed_server.url}/v1/encode/{TINY}"
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "s3cret"}):
        r = httpx.post(url, json={"inputs": ["x"]}, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"] == {
            "code": "unauthorized",
            "message": "missing or wrong API key (Authorization: Bearer <key>)",
            "field": "authorization",
        }
    assert httpx.get(keyed_server.url + "/v1/models").status_code == 401
    assert httpx.get(keyed_server.url + "/healthz").status_code == 200
    assert httpx.get(keyed_server.url + "/readyz").status_code == 200


def test_right_key_passes_and_the_sdk_sends_it(keyed_server: ServerThread) -> None:
    r = httpx.post(
        f"{keyed_server.url}/v1/encode/{TINY}",
        json={"inputs": ["x"]},
        headers={"authorization": "Bearer s3cret"},
    )
    assert r.status_code == 200
    with fleetserve.Client(keyed_server.url, api_key="s3cret") as c:
        assert c.encode(TINY, ["fox"]).shape == (1, 32)
    with fleetserve.Client(keyed_server.url) as c, pytest.raises(fleetserve.Unauthorized):
        c.encode(TINY, ["fox"])


def test_settings_repr_redacts_the_key(keyed_server: ServerThread) -> None:
    assert "s3cret" not in repr(keyed_server.settings)
