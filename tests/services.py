"""Services (a gateway's, a worker's) run in one thread with its own event loop.

Tests that need a real gateway and worker in this process, talking over a real
nats-server, start them here: in order, stopped in reverse on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fleetserve.lifecycle import Service


class Services:
    """``Services(a, b)``, or ``Services(build=f)`` to build them in the thread's loop
    (for objects that bind to the running loop when made)."""

    def __init__(
        self, *services: Service, build: Callable[[], Sequence[Service]] | None = None
    ) -> None:
        self.services: Sequence[Service] = services
        self._build = build
        self.loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),))

    async def _main(self) -> None:
        try:
            if self._build is not None:
                self.services = self._build()
            for s in self.services:
                await s.start()
        except BaseException as exc:
            self._error = exc
        self._started.set()
        with contextlib.suppress(BaseException):
            await self._stop.wait()
        for s in reversed(self.services):
            with contextlib.suppress(Exception):
                await s.stop()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the services' loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    call = run

    def __enter__(self) -> Services:
        self._thread.start()
        self._started.wait(120)
        if self._error is not None:
            self.__exit__()
            raise self._error
        return self

    def __exit__(self, *_: object) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self.loop.close()
