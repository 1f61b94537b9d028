"""MemoryStore: payloads in a dict, for tests and single-process (embedded) serving.

Nothing leaves the process, so it only works when the gateway and the workers share
one process, as ``fleetserve serve`` does. Each object keeps its wall-clock write
time for :meth:`MemoryStore.sweep`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .base import PayloadMissing, check_key, check_max_age, is_expired


class MemoryStore:
    """A dict of ``key -> (bytes, last-modified epoch seconds)``.

    ``clock`` (default :func:`time.time`) stamps writes and is "now" for ``sweep``;
    tests can pass a fake one. All methods run on the event loop without awaiting,
    so each one is atomic with respect to other tasks.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._objects: dict[str, tuple[bytes, float]] = {}
        self._clock = clock

    @property
    def url(self) -> str:
        return "memory://"

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._objects)} objects)"

    def __len__(self) -> int:
        return len(self._objects)

    async def put(self, key: str, data: bytes) -> None:
        self._objects[check_key(key)] = (bytes(data), self._clock())

    async def get(self, key: str) -> bytes:
        try:
            return self._objects[check_key(key)][0]
        except KeyError:
            raise PayloadMissing(key, self.url) from None

    async def delete(self, key: str) -> None:
        self._objects.pop(check_key(key), None)

    async def sweep(self, max_age: float) -> int:
        check_max_age(max_age)
        now = self._clock()
        old = [k for k, (_, mtime) in self._objects.items() if is_expired(mtime, max_age, now)]
        for key in old:
            del self._objects[key]
        return len(old)

    async def close(self) -> None:
        """Drops every payload: nothing else can reach them once the store is closed."""
        self._objects.clear()
