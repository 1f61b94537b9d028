"""The PayloadStore protocol: where bodies and results too big for a queue message go.

The gateway ``put``-s a large request body and publishes a reference; the worker
``get``-s it, and may ``put`` a large result the same way. The gateway ``delete``-s
both when the request completes or times out, and a TTL sweeper (``sweep``) removes
what a crash left behind.

Keys are short relative paths such as ``req/3f2a9c-in``: letters, digits and
``- _ . /``, made of non-empty segments that do not start with ``.`` (so no ``..``,
no leading or doubled ``/``). :func:`check_key` enforces this in every store, which
keeps a key from escaping a file store's root or an S3 prefix.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Protocol, runtime_checkable

MAX_KEY_LENGTH = 512
_KEY_CHARS = re.compile(r"[A-Za-z0-9._/-]+")


class PayloadMissing(LookupError):
    """The key is not in the store: never written, already deleted, or swept."""

    def __init__(self, key: str, store: str) -> None:
        super().__init__(f"payload {key!r} is not in the payload store {store}")
        self.key = key
        self.store = store


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid payload key, else raise ``ValueError`` saying why."""
    if not isinstance(key, str) or not key:
        raise ValueError("payload key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"payload key is longer than {MAX_KEY_LENGTH} characters: {key[:40]!r}…")
    if _KEY_CHARS.fullmatch(key) is None:
        raise ValueError(
            f"payload key {key!r} has characters other than letters, digits and '-_./'"
        )
    if key.startswith("/"):
        raise ValueError(f"payload key {key!r} starts with '/'; keys are relative")
    for segment in key.split("/"):
        if not segment:
            raise ValueError(f"payload key {key!r} has an empty segment ('//' or a trailing '/')")
        if segment.startswith("."):
            raise ValueError(f"payload key {key!r} has a segment starting with '.' (like '..')")
    return key


def is_expired(modified: float | datetime, max_age: float, now: float | None = None) -> bool:
    """Whether an object last modified at ``modified`` (epoch seconds or an aware
    datetime) is older than ``max_age`` seconds at ``now`` (default: the wall clock)."""
    if isinstance(modified, datetime):
        modified = modified.timestamp()
    if now is None:
        now = time.time()
    return now - modified > max_age


def check_max_age(max_age: float) -> float:
    """``sweep`` takes a non-negative age in seconds."""
    if max_age < 0:
        raise ValueError(f"max_age must be >= 0 seconds, got {max_age}")
    return max_age


@runtime_checkable
class PayloadStore(Protocol):
    """Bytes by key, with a last-modified time per object for the TTL sweeper.

    Implementations: :class:`~fleetserve.storage.memory.MemoryStore`,
    :class:`~fleetserve.storage.file.FileStore`, :class:`~fleetserve.storage.s3.S3Store`
    and :class:`~fleetserve.storage.nats.NatsObjectStore`. Every method validates the
    key with :func:`check_key` and raises ``ValueError`` for a bad one.
    """

    @property
    def url(self) -> str:
        """Where the store lives, for logs; never contains a secret."""
        ...

    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing what was there."""
        ...

    async def get(self, key: str) -> bytes:
        """The bytes under ``key``; raises :class:`PayloadMissing` when there are none."""
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``; a key that is not there is not an error."""
        ...

    async def sweep(self, max_age: float) -> int:
        """Delete every object last modified more than ``max_age`` seconds ago.

        Returns how many were deleted. Ages come from the store's own clock, so
        stores that keep whole seconds (S3) may sweep an object up to a second early.
        """
        ...

    async def close(self) -> None:
        """Release what the store holds (not a connection it was handed); idempotent."""
        ...
