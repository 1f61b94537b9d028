"""The distributed JobQueue: one NATS JetStream work-queue stream.

- The stream ``<PREFIX>_TRAIN`` (named as the inference queue's ``<PREFIX>_WORK``) holds
  one message per job, a :class:`~.queue.JobRef`, on ``<prefix>.train``. Its
  ``max_msgs`` with ``discard new`` is the bound: a message stays in a work-queue
  stream until it is acked, so jobs waiting and jobs running both count.
- One durable pull consumer, ``trainers``, shared by every worker with the training
  capability (and by every :class:`JetStreamJobQueue` opened on the same prefix).
  Explicit acks; ``max_deliver`` unlimited, since the runner decides from
  ``deliveries`` when a job has been tried often enough.
- A holder sends in-progress acks (``progress``), each of which restarts ``ack_wait``;
  a worker that dies stops sending them, and the job is redelivered after ``ack_wait``.

Every worker must open the queue with the same ``ack_wait``: the consumer is one, and
the last ``open`` sets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from types import ModuleType
from typing import TYPE_CHECKING

from ...wire import Overloaded, Unavailable
from .queue import JobRef, Lease

if TYPE_CHECKING:  # nats-py is optional (the nats extra): annotations only
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

log = logging.getLogger("fleetserve.lora.jobs")
CONSUMER = "trainers"
MAX_MSGS = 10077  # JetStream: maximum messages exceeded (the stream is full)
EXISTS = 10058  # JetStream: the stream exists with another configuration
NAK = b"-NAK"
MIN_FETCH = 0.05  # seconds: the shortest pull request sent, even for take(0)


def _nats() -> ModuleType:
    try:
        import nats
        import nats.js.api
    except ImportError:
        raise Unavailable(
            "the distributed fine-tuning queue needs nats-py; install the nats extra: "
            "pip install 'fleetserve[nats]'"
        ) from None
    return nats


def stream_name(prefix: str) -> str:
    """``<PREFIX>_TRAIN``, with the case rules of the inference queue's stream."""
    return f"{prefix.upper().replace('.', '_')}_TRAIN"


class JetStreamJobQueue:
    """JobQueue over NATS JetStream, for workers in separate processes. Build it with
    :meth:`open`; ``close`` leaves the NATS connection it was given open."""

    def __init__(
        self,
        nc: NATS,
        sub: JetStreamContext.PullSubscription,
        *,
        prefix: str,
        ack_wait: float,
        max_queued: int,
        retry_after: float,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._sub = sub
        self.prefix = prefix
        self.stream = stream_name(prefix)
        self.subject = f"{prefix}.train"
        self.max_queued = max_queued
        self.retry_after = retry_after
        self._ack_wait = ack_wait
        self._lock = asyncio.Lock()  # one pull request at a time on the subscription
        self._fetching: asyncio.Future[list[Msg]] | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        nc: NATS,
        *,
        prefix: str,
        ack_wait: float = 30.0,
        storage: str = "file",
        max_queued: int = 10000,
        replicas: int = 1,
        retry_after: float = 30.0,
    ) -> JetStreamJobQueue:
        """Create (or update) the stream and the consumer on a connected nats client."""
        _nats()
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, not {max_queued}")
        if ack_wait <= 0:
            raise ValueError(f"ack_wait must be positive, not {ack_wait}")
        js = nc.jetstream()
        await _ensure(
            js, prefix, ack_wait=ack_wait, storage=storage, max_queued=max_queued, replicas=replicas
        )
        sub = await js.pull_subscribe_bind(consumer=CONSUMER, stream=stream_name(prefix))
        return cls(
            nc,
            sub,
            prefix=prefix,
            ack_wait=ack_wait,
            max_queued=max_queued,
            retry_after=retry_after,
        )

    @property
    def ack_wait(self) -> float:
        return self._ack_wait

    async def submit(self, ref: JobRef) -> None:
        if self._closed:
            raise Unavailable("the fine-tuning queue is closed", retry_after=self.retry_after)
        try:
            await self._js.publish(self.subject, ref.encode(), stream=self.stream, timeout=5.0)
        except Exception as exc:
            if getattr(exc, "err_code", None) == MAX_MSGS:
                raise Overloaded(
                    f"the fine-tuning queue is full ({self.max_queued} jobs waiting or "
                    "running); retry later",
                    retry_after=self.retry_after,
                ) from None
            # the text may name the broker's hosts: logged here, not sent
            log.warning("could not queue job %s: %s: %s", ref.job_id, type(exc).__name__, exc)
            raise Unavailable(
                f"could not queue the job: {type(exc).__name__}; retry",
                retry_after=self.retry_after,
            ) from None

    async def take(self, timeout: float) -> Lease | None:
        if self._closed:
            return None
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        try:
            async with asyncio.timeout_at(end):
                await self._lock.acquire()
        except TimeoutError:
            return None
        try:
            while not self._closed:
                raw = await self._fetch(max(end - loop.time(), MIN_FETCH))
                if raw is None:
                    return None
                lease = await self._lease(raw)
                if lease is not None:
                    return lease
                if end - loop.time() <= 0:
                    return None
            return None
        finally:
            self._lock.release()

    async def close(self) -> None:
        """Stop taking: a take in progress returns ``None``. Leases still held stay
        valid; those never settled are redelivered after ``ack_wait``."""
        if self._closed:
            return
        self._closed = True
        if self._fetching is not None and not self._fetching.done():
            self._fetching.cancel()
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()

    # -- internals ----------------------------------------------------------------
    async def _fetch(self, timeout: float) -> Msg | None:
        """One message within ``timeout`` seconds, or ``None``."""
        nats = _nats()
        self._fetching = fetch = asyncio.ensure_future(self._sub.fetch(1, timeout=timeout))
        try:
            [raw] = await fetch
            return raw
        except (nats.errors.TimeoutError, TimeoutError):
            return None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                return None  # close() stopped the pull, not our caller
            fetch.cancel()
            raise
        except Exception as exc:  # the connection is down, or the consumer is gone
            if self._closed:
                return None
            log.warning("could not take a fine-tuning job: %s %s", type(exc).__name__, exc)
            await self._recover(timeout)
            return None
        finally:
            self._fetching = None

    async def _recover(self, wait: float) -> None:
        """Restore the stream and consumer (a server with memory storage restarted
        empty), then wait out the take's time so that a looping caller does not spin."""
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        try:
            await _ensure(
                self._js,
                self.prefix,
                ack_wait=self._ack_wait,
                storage=None,
                max_queued=self.max_queued,
            )
        except Exception as exc:
            log.debug("could not restore the fine-tuning stream: %s", exc)
        await asyncio.sleep(max(0.0, end - loop.time()))

    async def _lease(self, raw: Msg) -> Lease | None:
        try:
            ref = JobRef.decode(raw.data)
        except ValueError as exc:
            seq = getattr(raw.metadata.sequence, "stream", "?")
            log.warning("dropped a malformed fine-tuning job message (seq %s): %s", seq, exc)
            await _quietly(raw.term(), "term")
            return None
        return _JetStreamLease(self._nc, raw, ref, int(raw.metadata.num_delivered))


async def _ensure(
    js: JetStreamContext,
    prefix: str,
    *,
    ack_wait: float,
    storage: str | None,
    max_queued: int,
    replicas: int | None = None,
) -> None:
    """The stream and its consumer, created or brought to this configuration.

    ``storage=None`` and ``replicas=None`` keep what the stream has (or ``file`` and 1
    when creating it).
    """
    from nats.js import api

    name = stream_name(prefix)
    if storage is None or replicas is None:
        try:
            config = (await js.stream_info(name)).config
            storage = storage or config.storage or "file"
            replicas = replicas or config.num_replicas or 1
        except Exception:
            storage, replicas = storage or "file", replicas or 1
    config = api.StreamConfig(
        name=name,
        subjects=[f"{prefix}.train"],
        retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType(storage),
        num_replicas=replicas,
        max_msgs=max_queued,
        discard=api.DiscardPolicy.NEW,
    )
    try:
        await js.add_stream(config)
    except Exception as exc:
        if getattr(exc, "err_code", None) != EXISTS:
            raise
        await js.update_stream(config)
    consumer = api.ConsumerConfig(
        durable_name=CONSUMER,
        filter_subject=f"{prefix}.train",
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=-1,
        max_ack_pending=max_queued,  # every job in the stream may be running at once
    )
    await js.add_consumer(name, consumer)  # creates, or updates a durable in place


class _JetStreamLease:
    __slots__ = ("_deliveries", "_nc", "_raw", "_ref", "_settled")

    def __init__(self, nc: NATS, raw: Msg, ref: JobRef, deliveries: int) -> None:
        self._nc = nc
        self._raw = raw
        self._ref = ref
        self._deliveries = deliveries
        self._settled = False

    @property
    def ref(self) -> JobRef:
        return self._ref

    @property
    def deliveries(self) -> int:
        return self._deliveries

    async def progress(self) -> None:
        if not self._settled:
            await _quietly(self._raw.in_progress(), "in-progress ack")

    async def done(self) -> None:
        if not self._settled:
            self._settled = True
            await _quietly(self._raw.ack_sync(timeout=5.0), "ack")

    async def release(self) -> None:
        """A NAK that waits for the server to have it (``msg.nak()`` does not): a
        released job goes before new ones only once the server has put it back."""
        if not self._settled:
            self._settled = True
            await _quietly(self._nc.request(self._raw.reply, NAK, timeout=5.0), "nak")

    def __repr__(self) -> str:
        return f"<lease {self._ref.tenant}/{self._ref.job_id} delivery {self._deliveries}>"


async def _quietly(coro: Awaitable[object], what: str) -> None:
    """Settle without raising: a lost ack, nak or in-progress ack ends, at worst, in a
    redelivery after ``ack_wait``, which the runner handles (the store has the state)."""
    try:
        await coro
    except Exception as exc:
        log.warning("fine-tuning job %s failed: %s %s", what, type(exc).__name__, exc)
