"""The gateway's handle on one published request, shared by every WorkQueue."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable

from ..wire import DeadlineExceeded, Reply


def _retrieved(f: asyncio.Future[Reply]) -> None:
    if not f.cancelled():
        f.exception()  # failed while nobody waits (e.g. at shutdown): no warning


class Pending:
    """A future for the final reply, and a queue for a streamed reply's chunks.

    ``forget`` removes it from its queue's table. A reply with ``final=False`` is one
    chunk of a stream: ``stream`` yields chunks in order, then the final reply.
    """

    def __init__(self, request_id: str, forget: Callable[[str], object]) -> None:
        self.request_id = request_id
        self._forget = forget
        self.future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.future.add_done_callback(_retrieved)
        self._chunks: asyncio.Queue[Reply] = asyncio.Queue()

    async def wait(self, timeout: float) -> Reply:
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                return await self.future
        except TimeoutError:
            raise _deadline(timeout) from None
        finally:
            self.cancel()

    async def stream(self, timeout: float) -> AsyncGenerator[Reply, None]:
        """Each chunk as it arrives, then the final reply; the deadline covers them all."""
        deadline = time.monotonic() + max(timeout, 0.0)
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    async with asyncio.timeout(max(left, 0.0)):
                        reply = await self._next()
                except TimeoutError:
                    raise _deadline(timeout) from None
                yield reply
                if reply.final:
                    return
        finally:
            self.cancel()

    async def _next(self) -> Reply:
        if not self._chunks.empty():
            return self._chunks.get_nowait()
        get = asyncio.ensure_future(self._chunks.get())
        try:
            await asyncio.wait({get, self.future}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            return get.result()
        return self.future.result()

    def cancel(self) -> None:
        self._forget(self.request_id)

    def resolve(self, reply: Reply) -> None:
        if self.future.done():
            return
        if reply.final:
            self.future.set_result(reply)
        else:
            self._chunks.put_nowait(reply)

    def fail(self, err: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(err)


def _deadline(timeout: float) -> DeadlineExceeded:
    """``timeout``: what was left of the deadline when the wait began (below 0 where it
    had passed already: said as 0, not ``-0.000s``)."""
    return DeadlineExceeded(f"no result within {max(timeout, 0.0):.3f}s", field="x-request-timeout")
