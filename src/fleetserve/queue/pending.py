"""The gateway's handle on one published request, shared by every WorkQueue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..wire import DeadlineExceeded, Reply


def _retrieved(f: asyncio.Future[Reply]) -> None:
    if not f.cancelled():
        f.exception()  # failed while nobody waits (e.g. at shutdown): no warning


class Pending:
    """A future for the reply; ``forget`` removes it from its queue's table."""

    def __init__(self, request_id: str, forget: Callable[[str], object]) -> None:
        self.request_id = request_id
        self._forget = forget
        self.future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.future.add_done_callback(_retrieved)

    async def wait(self, timeout: float) -> Reply:
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                return await self.future
        except TimeoutError:
            raise DeadlineExceeded(
                f"no result within {timeout:.3f}s", field="x-request-timeout"
            ) from None
        finally:
            self.cancel()

    def cancel(self) -> None:
        self._forget(self.request_id)

    def resolve(self, reply: Reply) -> None:
        if not self.future.done():
            self.future.set_result(reply)

    def fail(self, err: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(err)
