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
        self.worker_up = Gauge(
            "fleetserve_worker_up", "1 while the worker's stages are running.", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
