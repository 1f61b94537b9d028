"""Build the distributed queue from Settings: JetStream, plus payload offload."""

from __future__ import annotations

from collections.abc import Mapping

from ..metrics import Metrics
from ..settings import Settings
from ..storage import Offload, PayloadStore, open_store
from .jetstream import JetStreamQueue, StreamOptions
from .offload import OffloadingQueue

DEFAULT_STORE = "nats://fleetserve-payloads"
HEADROOM = 64 * 1024  # NATS max_payload counts headers too


def require_nats(settings: Settings) -> None:
    if not settings.nats:
        raise ValueError("distributed mode needs a NATS URL: --nats nats://HOST:4222")


def watch_broker(js: JetStreamQueue, metrics: Metrics) -> None:
    """``fleetserve_queue_ready`` and ``fleetserve_queue_storage_full_total`` follow ``js``."""
    metrics.queue_ready.set_function(lambda: float(js.healthy))
    js.writes.on_storage_full = metrics.queue_storage_full.inc


def stream_options(settings: Settings) -> StreamOptions:
    if settings.stream_storage not in ("file", "memory"):
        raise ValueError(f"stream_storage must be file or memory, not {settings.stream_storage!r}")
    if not 1 <= settings.stream_replicas <= 5:
        raise ValueError(f"stream_replicas must be 1 to 5, not {settings.stream_replicas}")
    return StreamOptions(
        prefix=settings.queue_prefix,
        storage=settings.stream_storage,
        replicas=settings.stream_replicas,
        max_depth=settings.max_queue_depth,
        max_bytes=settings.stream_max_bytes,
        max_age=settings.stream_max_age,
        max_deliver=settings.max_deliver,
        ack_wait=settings.ack_wait or 5.0,
    )


async def open_distributed(
    settings: Settings, node: str, ack_waits: Mapping[str, float] | None = None
) -> tuple[JetStreamQueue, OffloadingQueue, PayloadStore]:
    """Connect (retrying with backoff), ensure the streams, open the payload store.

    Returns the JetStream queue itself (for its connection and dead letters), the
    offloading wrapper to use as the WorkQueue, and the payload store.
    """
    require_nats(settings)
    js = JetStreamQueue(
        settings.nats,
        stream_options(settings),
        retry_after=settings.retry_after,
        node=node,
        connect_for=settings.nats_connect_timeout,
        age_limit=settings.batch_age_limit,
        probe_interval=settings.queue_probe_interval,
    )
    await js.start()
    if ack_waits and js.puller is not None:
        js.puller.ack_waits.update(ack_waits)
    url = settings.payload_store or DEFAULT_STORE
    store = await open_store(
        url,
        nats=js.nc,
        s3_access_key_id=settings.s3_access_key_id or None,
        s3_secret_access_key=settings.s3_secret_access_key or None,
        s3_region=settings.s3_region or None,
        s3_endpoint=settings.s3_endpoint or None,
    )
    limit = int(js.connection().max_payload) - HEADROOM
    threshold = max(0, min(settings.offload_threshold, limit))
    return (
        js,
        OffloadingQueue(js, Offload(store, threshold=threshold, retry_after=settings.retry_after)),
        store,
    )
