"""Waiting on a condition, for tests: the one poll loop the suite uses.

A test that needs something to have happened (a server ready, a metric counted, a
process gone) waits for that, not for a fixed time: a fixed sleep is too short on a
loaded machine and too long on a quiet one. ``wait_for`` polls from a thread,
``async_wait_for`` from a coroutine (its check may be a coroutine function too).
Both return the check's first truthy result and fail the test, naming what they
waited for (``what``: a text, or a function that tells the state when it failed),
when ``timeout`` passes first.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

INTERVAL_S = 0.05


def wait_for(
    check: Callable[[], T],
    timeout: float = 15.0,
    what: str | Callable[[], object] = "",
    *,
    interval: float = INTERVAL_S,
) -> T:
    """Poll ``check()`` until it returns something truthy; return that."""
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= end:
            raise AssertionError(_timed_out(timeout, what or check))
        time.sleep(interval)


async def async_wait_for(
    check: Callable[[], T | Awaitable[T]],
    timeout: float = 15.0,
    what: str | Callable[[], object] = "",
    *,
    interval: float = INTERVAL_S,
) -> T:
    """``wait_for`` on the running loop: sleeps between checks yield to it."""
    end = time.monotonic() + timeout
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got  # type: ignore[return-value]
        if time.monotonic() >= end:
            raise AssertionError(_timed_out(timeout, what or check))
        await asyncio.sleep(interval)


def _timed_out(timeout: float, what: str | Callable[[], object]) -> str:
    return f"timed out after {timeout:g} s waiting for {what if isinstance(what, str) else what()}"


async def tasks_left(since: set[asyncio.Task[object]], timeout: float = 5.0) -> set[object]:
    """The tasks started on this loop after ``since`` (``asyncio.all_tasks()`` then)
    that have not ended within ``timeout``: what stopped work left running."""
    started = asyncio.all_tasks() - since
    if not started:
        return set()
    _, pending = await asyncio.wait(started, timeout=timeout)
    return set(pending)
