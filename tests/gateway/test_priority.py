"""The X-Priority header and the class a request is served in (issue 12)."""

from __future__ import annotations

import httpx
import pytest

from fleetserve.catalog.spec import Profile
from fleetserve.gateway.envelope import CLAIM_FACTOR, classify
from fleetserve.wire import Priority

from ..conftest import TINY, ServerThread

SMALL = {"inputs": ["one short query"]}
THRESHOLD_BYTES = Profile.interactive_cost * 4  # the tiny profile keeps the default


def bulk(nbytes: int) -> dict[str, list[str]]:
    """A body of about ``nbytes`` bytes."""
    text = "bulk text to embed " * 10
    return {"inputs": [text] * (nbytes // len(text) + 1)}


def post(srv: ServerThread, body: object, **headers: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/encode/{TINY}", json=body, headers=headers, timeout=30)


def test_the_class_follows_the_predicted_cost(tiny_server: ServerThread) -> None:
    small = post(tiny_server, SMALL)
    assert small.status_code == 200 and small.headers["x-priority"] == "interactive"
    big = post(tiny_server, bulk(2 * THRESHOLD_BYTES))
    assert big.status_code == 200 and big.headers["x-priority"] == "batch"


def test_the_header_overrides_it(tiny_server: ServerThread) -> None:
    assert post(tiny_server, SMALL, **{"x-priority": "batch"}).headers["x-priority"] == "batch"
    claimed = post(tiny_server, bulk(2 * THRESHOLD_BYTES), **{"x-priority": "Interactive"})
    assert claimed.status_code == 200 and claimed.headers["x-priority"] == "interactive"


def test_a_huge_request_that_claims_interactive_is_served_as_batch(
    tiny_server: ServerThread,
) -> None:
    r = post(tiny_server, bulk(2 * CLAIM_FACTOR * THRESHOLD_BYTES), **{"x-priority": "interactive"})
    assert r.status_code == 200
    assert r.headers["x-priority"] == "batch"  # the response says how it was served


@pytest.mark.parametrize("value", ["urgent", "", "interactive,batch"])
def test_a_bad_priority_is_400_naming_the_header(tiny_server: ServerThread, value: str) -> None:
    r = post(tiny_server, SMALL, **{"x-priority": value})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["field"] == "x-priority" and "X-Priority" in err["message"]


def test_classify() -> None:
    assert classify(10, None, 100) is Priority.INTERACTIVE
    assert classify(101, None, 100) is Priority.BATCH
    assert classify(10, Priority.BATCH, 100) is Priority.BATCH
    assert classify(400, Priority.INTERACTIVE, 100) is Priority.INTERACTIVE
    assert classify(401, Priority.INTERACTIVE, 100) is Priority.BATCH
