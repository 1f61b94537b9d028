"""Offloading big bodies and results to a payload store, and sweeping what is left.

The flow, for a request body (``kind="in"``) and likewise for a result (``"out"``):

1. The sender calls :meth:`Offload.stash`. A body of at most ``threshold`` bytes is
   not stored and ``None`` comes back: send it as it is. A bigger one is stored under
   :func:`new_key` and its key comes back.
2. The message carries the key instead of the body: in the ``Fleetserve-Payload``
   header (:data:`REF_HEADER`) with an empty body, or, where a transport has no
   headers, as the body :func:`make_ref` builds (:func:`parse_ref` reads it back).
3. The receiver calls :meth:`Offload.load` with the key.
4. The gateway calls :meth:`Offload.discard` when the request completes or times out;
   :func:`sweep_forever` removes whatever a crash or a late worker left behind.

Keys are derived from the request id, so the gateway can delete a result's key
without having seen a reply. Request ids are unique (JetStream de-duplicates on them).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Literal, NoReturn

from .base import PayloadStore, check_key
from .outage import kind_of, unreachable

log = logging.getLogger(__name__)

REF_HEADER = "Fleetserve-Payload"
DEFAULT_THRESHOLD = 1 << 20  # 1 MiB
KEY_PREFIX = "req/"
# 0xC1 is never used in msgpack and never valid in UTF-8, so no msgpack or JSON body
# can start with it: a body that does is a reference, never data.
REF_MARKER = b"\xc1fleetserve-payload:"
_SAFE = re.compile(r"[A-Za-z0-9-]")
_MAX_ID = 200

Kind = Literal["in", "out"]


def new_key(request_id: str, kind: Kind) -> str:
    """The payload key for a request's body (``in``) or result (``out``).

    ``req/<request_id>-<kind>``; characters other than letters, digits and ``-`` are
    escaped as ``_XX`` (so distinct ids give distinct keys), and an id that is still
    longer than 200 characters is replaced by its SHA-256.
    """
    if kind not in ("in", "out"):
        raise ValueError(f"payload kind must be 'in' or 'out', not {kind!r}")
    if not request_id:
        raise ValueError("request id is empty")
    safe = "".join(
        c if _SAFE.match(c) else "".join(f"_{b:02X}" for b in c.encode()) for c in request_id
    )
    if len(safe) > _MAX_ID:
        safe = "sha256-" + hashlib.sha256(request_id.encode()).hexdigest()
    return check_key(f"{KEY_PREFIX}{safe}-{kind}")


def make_ref(key: str) -> bytes:
    """A body that stands for the payload under ``key``."""
    return REF_MARKER + check_key(key).encode("ascii")


def parse_ref(body: bytes) -> str | None:
    """The key if ``body`` is a reference made by :func:`make_ref`, else None."""
    if not body.startswith(REF_MARKER):
        return None
    return check_key(bytes(body[len(REF_MARKER) :]).decode("ascii"))


@dataclass(frozen=True, slots=True)
class Offload:
    """A payload store plus the size above which bodies go to it."""

    store: PayloadStore
    threshold: int = DEFAULT_THRESHOLD
    retry_after: float | None = None  # the setting, in the 503 of a store outage

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"offload threshold must be >= 0 bytes, got {self.threshold}")

    def needed(self, size: int) -> bool:
        """Whether a body of ``size`` bytes goes to the store."""
        return size > self.threshold

    async def stash(self, request_id: str, kind: Kind, data: bytes) -> str | None:
        """Store ``data`` if it is over the threshold and return its key; else None."""
        if not self.needed(len(data)):
            return None
        key = new_key(request_id, kind)
        with self._guard():
            await self.store.put(key, data)  # away: a 503 without the store's text
        return key

    async def load(self, key: str) -> bytes:
        """The payload; raises :class:`~fleetserve.storage.base.PayloadMissing`, or
        ``Unavailable`` if the store is away."""
        with self._guard():
            return await self.store.get(key)

    def _guard(self) -> contextlib.AbstractContextManager[None]:
        return unreachable("payload store", kind_of(self.store), self.store.url, self.retry_after)

    async def discard(self, request_id: str) -> None:
        """Delete the request's body and result, if stored. Never raises on a store
        error: it is logged, and the sweeper removes the payload later."""
        keys = [new_key(request_id, "in"), new_key(request_id, "out")]
        results = await asyncio.gather(
            *(self.store.delete(k) for k in keys), return_exceptions=True
        )
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, Exception):
                log.warning("could not delete payload %s from %s: %r", key, self.store.url, result)
            elif isinstance(result, BaseException):
                raise result


async def sweep_forever(store: PayloadStore, max_age: float, every: float) -> NoReturn:
    """Sweep ``store`` of objects older than ``max_age`` seconds, now and then every
    ``every`` seconds, until cancelled. Store errors are logged, never raised."""
    if every <= 0:
        raise ValueError(f"sweep interval must be > 0 seconds, got {every}")
    while True:
        try:
            deleted = await store.sweep(max_age)
        except Exception as exc:
            log.warning("payload sweep of %s failed, retrying in %gs: %r", store.url, every, exc)
        else:
            level = logging.INFO if deleted else logging.DEBUG
            log.log(level, "payload sweep of %s deleted %d objects", store.url, deleted)
        await asyncio.sleep(every)
