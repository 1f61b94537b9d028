"""A request's wait for its reply (queue/pending.py): the deadline's error says the time
that was left, never a negative one."""

from __future__ import annotations

import re

import pytest

from fleetserve.queue.pending import Pending
from fleetserve.wire import DeadlineExceeded


@pytest.mark.parametrize(("left", "says"), [(0.05, "0.050s"), (-0.2, "0.000s"), (-1e-7, "0.000s")])
async def test_a_wait_past_its_deadline_says_what_was_left_and_forgets_the_request(
    left: float, says: str
) -> None:
    forgot: list[str] = []
    with pytest.raises(DeadlineExceeded, match=re.escape(f"no result within {says}")) as info:
        await Pending("r1", forgot.append).wait(left)
    assert info.value.field == "x-request-timeout" and forgot == ["r1"]


async def test_a_stream_past_its_deadline_says_so_alike() -> None:
    pending = Pending("r2", lambda _: None)
    with pytest.raises(DeadlineExceeded, match=re.escape("no result within 0.000s")):
        async for _ in pending.stream(-3.0):
            pass
