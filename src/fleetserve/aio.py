"""asyncio helpers every layer may use."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any], *, errors: bool = False) -> None:
    """Cancel ``task`` and wait until it has ended; its own cancellation is not an
    error, nor (``errors=True``) anything else it raised.

    The caller's cancellation is never swallowed, as a bare
    ``suppress(CancelledError)`` around the ``await`` does when it lands there: a
    Ctrl-C (``asyncio.run`` cancels the main task) that came while a tune stopped its
    measuring worker was lost, and the tune went on to write its profile."""
    me = asyncio.current_task()
    before = me.cancelling() if me is not None else 0  # (in a clean-up after a cancel: 1)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:
        if not errors:
            raise
    finally:  # cancelled while it waited: however the task ended, so is the caller
        if me is not None and me.cancelling() > before:
            raise asyncio.CancelledError


__all__ = ["cancel_and_wait"]
