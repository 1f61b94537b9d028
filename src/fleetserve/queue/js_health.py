"""Whether JetStream accepts writes: what the last publish, or a probe, found.

A connected broker may still refuse to store: a full disk, or an account or server
storage limit. nats-server then answers a publish with an error (``insufficient storage
resources``) or, after a critical write error on the stream's file store, not at all.
Either way the gateway's and the workers' ``/readyz`` must say 503 until it stores
again, and a request must get a 503 at once that says why, not a 504 after its deadline.

A probe publishes an empty message to ``<prefix>.probe``, a subject of the work stream
outside ``<prefix>.work.>`` (no lane, consumer or fleet view sees it), and purges it:
every ``interval`` seconds while writes are accepted, every second while they are not,
so that readiness comes back on its own once the broker stores again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from .js_options import StreamOptions

log = logging.getLogger("fleetserve.queue")
FULL = 10077  # JetStream: a stream limit (e.g. maximum messages per subject) exceeded
STORAGE_CODES = frozenset({10023, 10028, 10047})  # insufficient resources, memory, storage
_STORAGE_WORDS = ("insufficient", "no space", "storage", "resources")
STORAGE_FULL = "queue storage full"


def storage_refusal(exc: BaseException) -> str | None:
    """The reason, when ``exc`` is JetStream refusing a write for lack of storage."""
    code = getattr(exc, "err_code", None)
    text = str(getattr(exc, "description", None) or exc)
    if code in STORAGE_CODES or (code == FULL and any(w in text.lower() for w in _STORAGE_WORDS)):
        return f"{STORAGE_FULL}: JetStream refused the write ({text})"
    return None


def unconfirmed(timeout: float) -> str:
    return (
        f"{STORAGE_FULL} or failing: JetStream did not confirm a write within {timeout:g}s "
        "(check the disk of the NATS store)"
    )


class Writes:
    """Accepted or refused, as last seen; ``refused`` says why (None: accepted).

    A publish that stores, or a probe, accepts again. ``hold`` (seconds), for a queue
    that runs no probes, ends a refusal on its own that long after it was last seen:
    with nothing to probe the broker, the next publish is what tries again, and
    readiness must not stay 503 for good after one refused write."""

    def __init__(
        self, hold: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._refused: str | None = None
        self._until = 0.0  # clock time at which a held refusal ends
        self.hold = hold
        self._clock = clock
        self.storage_full = 0  # writes refused (or unconfirmed) by a connected broker
        self.on_storage_full: Callable[[], None] | None = None  # a metric's inc

    @property
    def refused(self) -> str | None:
        if self._refused is not None and self.hold is not None and self._clock() >= self._until:
            log.warning("no write refused for %gs (no probes run): ready again", self.hold)
            self._refused = None
        return self._refused

    def refuse(self, why: str) -> None:
        self.storage_full += 1
        if self.on_storage_full is not None:
            self.on_storage_full()
        if self.refused is None:
            log.error("JetStream refuses writes: %s; /readyz is 503 until it stores again", why)
        self._refused = why
        self._until = self._clock() + (self.hold or 0.0)

    def accept(self) -> None:
        if self._refused is not None:
            log.warning("JetStream stores again; ready")
        self._refused = None


def probe_subject(options: StreamOptions) -> str:
    return f"{options.prefix}.probe"


async def probe(js: JetStreamContext, options: StreamOptions, timeout: float) -> None:
    """One write to the work stream, then its removal; raises what the publish raised."""
    subject = probe_subject(options)
    try:
        await js.publish(subject, b"", timeout=timeout)
    except Exception as exc:
        if getattr(exc, "err_code", None) != FULL or storage_refusal(exc):
            raise  # probes left behind by a failed purge filled the subject: stored fine
    async with asyncio.timeout(timeout):
        await js.purge_stream(options.stream, subject=subject)


async def probe_forever(
    writes: Writes,
    js: JetStreamContext,
    options: StreamOptions,
    interval: float,
    connected: Callable[[], bool],
    timeout: float = 2.0,
    *,
    reconnected_at: Callable[[], float] = lambda: 0.0,
) -> None:
    """Probe every ``interval`` seconds (every second while refused) while connected.
    A probe that fails while the connection drops, or across a reconnect
    (``reconnected_at``: when the connection last came back), says nothing of the
    store: a broker killed and restarted under a probe is not a full disk."""
    while True:
        await asyncio.sleep(min(interval, 1.0) if writes.refused else interval)
        if not connected():
            continue  # unreachable is the connection's to report
        since = reconnected_at()
        try:
            await probe(js, options, timeout)
        except Exception as exc:
            if not connected() or reconnected_at() != since:
                continue
            why = storage_refusal(exc)
            if why is None and isinstance(exc, TimeoutError):
                why = unconfirmed(timeout)
            if why is None:
                log.debug("write probe failed: %s", exc)
                continue
            writes.refuse(why)
            continue
        writes.accept()


class Backoff:
    """Retries of a call to a broker that is away: 0.1 s doubling to 2 s, one log line
    when it starts failing and one when it works again. ``what`` names the calls."""

    def __init__(self, first: float = 0.1, most: float = 2.0, what: str = "calls") -> None:
        self.first, self.most, self.what = first, most, what
        self.delay = 0.0
        self.until = 0.0  # loop time before which not to try

    def wait(self, now: float) -> float:
        return self.until - now

    def failed(self, now: float, exc: BaseException) -> float:
        if not self.delay:
            log.warning(
                "JetStream is not answering (%s); retrying %s with backoff", _why(exc), self.what
            )
        self.delay = min(max(self.delay * 2, self.first), self.most)
        self.until = now + self.delay
        return self.delay

    def succeeded(self) -> None:
        if self.delay:
            log.warning("JetStream answers %s again", self.what)
        self.delay = 0.0
        self.until = 0.0


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
