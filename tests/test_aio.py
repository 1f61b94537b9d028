"""aio: cancelling a task without losing the caller's own cancellation."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from fleetserve.aio import cancel_and_wait


async def slow_to_stop(stopping: asyncio.Event, release: asyncio.Event) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        stopping.set()
        await release.wait()  # its clean-up takes a while
        raise


async def test_the_tasks_own_cancellation_is_no_error_and_its_exception_is_unless_asked() -> None:
    await cancel_and_wait(asyncio.ensure_future(asyncio.sleep(3600)))

    async def fails_when_stopped() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise ValueError("broken clean-up")

    async def started() -> asyncio.Task[None]:
        task = asyncio.ensure_future(fails_when_stopped())
        await asyncio.sleep(0)  # in its try block
        return task

    with pytest.raises(ValueError, match="broken clean-up"):
        await cancel_and_wait(await started())
    await cancel_and_wait(await started(), errors=True)


async def test_a_caller_cancelled_while_it_waits_is_cancelled_still() -> None:
    """What ``suppress(CancelledError)`` around the await lost: a Ctrl-C that came while
    a tune stopped its measuring worker (the caller went on as if nothing came)."""
    stopping, release = asyncio.Event(), asyncio.Event()
    went_on = asyncio.Event()

    async def caller() -> None:
        task = asyncio.ensure_future(slow_to_stop(stopping, release))
        await asyncio.sleep(0)  # it runs
        await cancel_and_wait(task)
        went_on.set()

    outer = asyncio.ensure_future(caller())
    await stopping.wait()
    outer.cancel()  # lands while it waits for the task's clean-up
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert not went_on.is_set()


async def test_a_task_that_swallows_the_cancel_does_not_take_the_callers_with_it() -> None:
    """A cancel of the caller passes on to the task it waits for; a task that swallows
    it and returns leaves the caller cancelled all the same."""
    stopping, release = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopping.set()
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()  # the caller's cancel, passed on, lands here

    async def caller() -> None:
        task = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)
        await cancel_and_wait(task)

    outer = asyncio.ensure_future(caller())
    await stopping.wait()
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer


async def test_a_clean_up_after_a_cancel_still_waits_and_goes_on() -> None:
    """In a clean-up that runs because its task was cancelled, the task it stops is
    waited for and the clean-up goes on: that cancel is not a new one."""
    cleaned = asyncio.Event()

    async def owner() -> None:
        helper = asyncio.ensure_future(asyncio.sleep(3600))
        try:
            await asyncio.sleep(3600)
        finally:
            await cancel_and_wait(helper)
            assert helper.cancelled()
            cleaned.set()

    task = asyncio.ensure_future(owner())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()
