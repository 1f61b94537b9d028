"""Prometheus metrics, one registry per server so that tests stay independent."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.035,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "fleetserve_requests",
            "HTTP requests by route, model and status code.",
            ["route", "model", "code"],
            registry=r,
        )
        self.stage_latency = Histogram(
            "fleetserve_stage_latency_seconds",
            "Latency per stage: queue (wait), preprocess, inference, postprocess, total.",
            ["model", "stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "fleetserve_batch_size",
            "Items per forward batch.",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.batch_tokens = Histogram(
            "fleetserve_batch_tokens",
            "Padded tokens per forward batch.",
            ["model"],
            buckets=(16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
            registry=r,
        )
        self.tokens = Counter(
            "fleetserve_tokens", "Real (unpadded) tokens processed.", ["model"], registry=r
        )
        self.queue_depth = Gauge(
            "fleetserve_queue_depth", "Requests waiting in the queue.", ["model"], registry=r
        )
        self.expired = Counter(
            "fleetserve_expired",
            "Work skipped because its deadline had passed.",
            ["model"],
            registry=r,
        )
        self.batch_fill = Histogram(
            "fleetserve_batch_fill",
            "Padded tokens per batch as a fraction of the batch budget.",
            ["model"],
            buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
            registry=r,
        )
        self.queue_lag = Gauge(
            "fleetserve_queue_lag_seconds",
            "How long the last request pulled for a model had waited in the queue.",
            ["model"],
            registry=r,
        )
        self.put_backs = Gauge(
            "fleetserve_put_backs",
            "Messages pulled beyond the batch budget and put back (a running count).",
            ["model"],
            registry=r,
        )
        self.redeliveries = Gauge(
            "fleetserve_redeliveries",
            "Messages delivered again after a NAK or a missed ack (a running count).",
            ["model"],
            registry=r,
        )
        self.dead_letters = Gauge(
            "fleetserve_dead_letters",
            "Messages sent to the dead-letter stream (a running count).",
            ["model"],
            registry=r,
        )
        self.cancelled = Counter(
            "fleetserve_cancelled",
            "Work stopped because its client went away, by where it was: queued (never "
            "pulled, or pulled after its cancel), loading (waiting for its model or "
            "adapter), batched (not started), running or generating. Work stopped at "
            "its deadline counts in fleetserve_expired.",
            ["model", "where"],
            registry=r,
        )
        self.retries = Counter(
            "fleetserve_retries",
            "Requests put back after their batch failed, to be tried again.",
            ["model"],
            registry=r,
        )
        self.slices = Counter(
            "fleetserve_slices",
            "Parts of requests too large for one batch, put back for other workers to share.",
            ["model"],
            registry=r,
        )
        self.utilization = Gauge(
            "fleetserve_device_utilization",
            "Fraction of recent wall time the model's forward thread was computing.",
            ["model"],
            registry=r,
        )
        self.worker_up = Gauge(
            "fleetserve_worker_up", "1 while the worker's stages are running.", registry=r
        )
        # -- the broker (queue/js_health.py) --------------------------------------
        self.queue_ready = Gauge(
            "fleetserve_queue_ready",
            "1 while NATS is reachable and JetStream stores what is published.",
            registry=r,
        )
        self.queue_storage_full = Counter(
            "fleetserve_queue_storage_full",
            "Writes JetStream refused for lack of storage, or did not confirm while connected.",
            registry=r,
        )
        # -- the fleet: models resident within the memory budget ------------------
        self.resident_models = Gauge(
            "fleetserve_resident_models", "Models resident in this worker.", registry=r
        )
        self.resident_bytes = Gauge(
            "fleetserve_resident_bytes",
            "Bytes held by resident (and loading) models, against the memory budget.",
            registry=r,
        )
        self.memory_budget = Gauge(
            "fleetserve_memory_budget_bytes", "This worker's memory budget.", registry=r
        )
        self.sleeping_bytes = Gauge(
            "fleetserve_sleeping_bytes",
            "Weights of sleeping models, held by the host tier (the page cache on a CPU).",
            registry=r,
        )
        self.host_tier_budget = Gauge(
            "fleetserve_host_tier_budget_bytes",
            "This worker's host-tier budget for sleeping models (0: none sleep).",
            registry=r,
        )
        self.memory_unaccounted = Gauge(
            "fleetserve_memory_unaccounted_bytes",
            "What the process's resident set (or the device's memory) grew beyond the "
            "fleet's charge for weights, summed over the checks at each load.",
            registry=r,
        )
        self.memory_drift = Counter(
            "fleetserve_memory_drift",
            "Checks at a load where the process's growth since the last check and the "
            "fleet's charge differed by more than 10 % of what moved, by event (load).",
            ["event"],
            registry=r,
        )
        self.loads = Counter(
            "fleetserve_model_loads", "Model loads by outcome (ok, woken, failed).",
            ["model", "outcome"], registry=r,
        )  # fmt: skip
        self.load_seconds = Histogram(
            "fleetserve_model_load_seconds",
            "Seconds per model load (resolve, fetch, convert, load, warm up).",
            ["model"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160),
            registry=r,
        )
        self.evictions = Counter(
            "fleetserve_model_evictions",
            "Models evicted, by reason: pressure (room for another), oom, host tier (a "
            "sleeping model dropped for want of host-tier room), removed.",
            ["model", "reason"],
            registry=r,
        )
        self.sleeps = Counter(
            "fleetserve_model_sleeps",
            "Evictions that put the model to sleep (its weights left memory, a host-side "
            "copy stayed) instead of unloading it.",
            ["model"],
            registry=r,
        )
        self.misses = Counter(
            "fleetserve_model_misses",
            "Requests that found their model not resident.",
            ["model"],
            registry=r,
        )

    def without_worker_gauges(self) -> Metrics:
        """A gateway's metrics: it runs no worker, so it must not export the worker's
        unlabelled gauges, whose 0 would read as a worker down (or an empty fleet)."""
        for gauge in (self.worker_up, self.resident_models, self.resident_bytes):
            self.registry.unregister(gauge)
        for g in (self.memory_budget, self.memory_unaccounted, self.sleeping_bytes):
            self.registry.unregister(g)
        self.registry.unregister(self.host_tier_budget)
        return self

    def render(self) -> bytes:
        return generate_latest(self.registry)
