"""One frozen, typed Settings object.

Each field declares its env variable, CLI flag and help text together. Settings are
read once in ``main()`` (defaults < config file < ``FLEETSERVE_*`` env < CLI flags)
and passed down. Nothing else in fleetserve reads the environment. How a field becomes
a flag and how the layers are read: ``settings_fields.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, fields

from .settings_background import Background
from .settings_fields import ENV_PREFIX, add_arguments, env_name, flag_name, layered, setting
from .settings_limits import Limits


@dataclass(frozen=True)
class Settings(Limits, Background):
    host: str = setting("127.0.0.1", "Address the HTTP API listens on.", groups="http client pool")
    port: int = setting(
        8080, "Port the HTTP API listens on (0 picks a free one).", groups="http client"
    )
    models: str = setting(
        "",
        "Comma-separated models to serve: ids (loaded at start) or patterns such as "
        "'org/*' (loaded on first use). Empty: the whole catalog.",
        groups="catalog",
    )
    catalog: str = setting(
        "", "Extra catalog directory of model spec YAML files.", groups="catalog"
    )
    watch_catalog: bool = setting(
        True, "Watch --catalog while serving: a spec file that appears or changes there is "
        "served without a restart, one removed is drained and unloaded (false: read at start).",
        groups="catalog",
    )  # fmt: skip
    model_roots: str = setting(
        "~/models", "Comma-separated directories (and s3://bucket/prefix prefixes) that "
        "POST /v1/models may name as a model's sources; package: and hf: sources are always "
        "allowed, any other path or URL is refused (400).",
        groups="catalog",
    )  # fmt: skip
    device: str = setting(
        "auto", "Device for the runtime: auto, cpu, cuda or cuda:N.", groups="runtime device"
    )
    hardware_class: str = setting(
        "",
        "Hardware class whose profiles to use (empty: detect; see `fleetserve hardware`).",
        groups="catalog",
    )
    profile_dir: str = setting(
        "~/.config/fleetserve/profiles",
        "Your tuned profiles (written by `fleetserve tune`); they override the bundled ones.",
        groups="catalog",
    )
    bundled_profiles: bool = setting(
        True,
        "Use the profiles bundled for this hardware class (false: serve as a class with "
        "none would, on rules from the other classes' evidence; for measuring --tune auto).",
        groups="catalog",
    )
    tune_dir: str = setting(
        "~/.cache/fleetserve/tune",
        "Where tuning runs keep their state and reports (shown on /dashboard).",
        groups="gateway tuning",
    )
    memory_budget: str = setting(
        "",
        "Memory for this worker's models (weights and activation peaks): bytes, a size "
        "(512MiB, 2GiB) or a percent of what the process may use (empty: 70% of the cgroup "
        "limit, else of physical RAM; of free device memory on CUDA).",
        groups="runtime",
    )
    memory_share_dir: str = setting(
        "",
        "Where the processes on this host that run on the default --memory-budget "
        "register, to split it between them (two workers started apart take 35% each) "
        "[empty: fleetserve-memory-UID in the temporary directory].",
        groups="runtime",
    )
    eviction: str = setting(
        "gdsf",
        "Which models leave under memory pressure: gdsf (reload cost, use, size) or lru.",
        groups="runtime",
    )
    load_retry_after: float = setting(
        30.0, "Seconds before a model that failed to load is tried again (its requests get "
        "the reason meanwhile); also the longest Retry-After of a 503 for want of room "
        "(less when room frees sooner).",
        groups="runtime",
    )  # fmt: skip
    room_wait: float = setting(
        5.0, "Seconds a load waits for busy models to finish when nothing can be evicted, "
        "before its request gets 503 (embedded mode; a shared queue puts it back at once).",
        groups="runtime",
    )  # fmt: skip
    affinity_wait: float = setting(
        2.0, "Seconds a cold model's oldest request may wait before a worker that does not "
        "hold it takes it (distributed mode: workers pull for the models they hold first).",
        groups="pool",
    )  # fmt: skip
    request_timeout: float = setting(
        30.0, "Default request deadline in seconds.", groups="gateway dlq"
    )
    batch_age_limit: float = setting(
        2.0, "Seconds batch-class work may wait in a worker while interactive work goes "
        "first; older batch work takes the next batch (no starvation).",
        groups="runtime",
    )  # fmt: skip
    interactive_hold: float = setting(
        5.0, "Seconds after an interactive request during which batches stay capped at the "
        "profile's priority_cap, so that the next query does not wait behind a full batch "
        "(each worker sees only the queries it pulls: a few seconds covers their gaps).",
        groups="runtime",
    )  # fmt: skip
    generation_timeout: float = setting(
        300.0,
        "Default deadline in seconds for chat and generate requests (long outputs).",
        groups="gateway",
    )
    max_queue_depth: int = setting(
        1024, "Bounded queue size per model; beyond it: 429.", groups="gateway"
    )
    retry_after: float = setting(
        1.0, "Retry-After seconds sent with 429 and 503.", groups="gateway"
    )
    max_batch_tokens: int = setting(
        0, "Override the profile's batch token budget (0: profile).", groups="runtime"
    )
    torch_threads: int = setting(
        0, "torch intra-op threads (0: one per core).", groups="runtime device"
    )
    cache_dir: str = setting(
        "~/.cache/fleetserve",
        "Where converted models (GGUF to safetensors) and ONNX exports are cached.",
        groups="catalog",
    )
    hf_cache: str = setting(
        "~/.cache/huggingface/hub",
        "The Hugging Face cache searched for hf: model sources.",
        groups="catalog",
    )
    reference_dir: str = setting(
        "",
        "Reference libraries that cannot share fleetserve's environment, one folder "
        "each (colbert-ai, which needs transformers 4, checks stanford-nlp ColBERT "
        "models). Empty: <the interpreter's prefix>/reference, where `make serve` "
        "installs them.",
        groups="catalog",
    )
    gil_switch_interval: float = setting(
        0.0005,
        "Python's GIL switch interval (s). Short: the forward thread gets the GIL back "
        "sooner between ops while other threads run Python.",
        groups="runtime",
    )
    log_level: str = setting("info", "Log level: debug, info, warning or error.", groups="common")
    log_format: str = setting(
        "text", "Log lines as text (time, level, logger, message, key=value) or json (one "
        "object per line).", groups="common",
    )  # fmt: skip
    access_log: bool = setting(
        True, "One log line per HTTP request: method, path, status, model, tenant, timings, "
        "request id, bytes.", groups="gateway",
    )  # fmt: skip
    api_key: str = setting(
        "",
        "One API key (legacy): clients send 'Authorization: Bearer <key>'; it is tenant "
        "'default' with every scope. Ignored when keys_file or keys is set.",
        secret=True,
        groups="auth client",
    )
    auth: str = setting(
        "auto",
        "auto: keys from --keys-file and --keys if given, else --api-key if set, else open; "
        "keys: the same, but refuse to start without a key; open: no authentication (the "
        "X-Tenant header picks the tenant). Anything else refuses to start.",
        groups="auth",
    )
    keys_file: str = setting(
        "",
        "YAML file of API keys: a list of {sha256, tenant, scopes, name}, scopes from infer, "
        "adapters:write, metrics, admin. Keys are stored hashed (`fleetserve keys add` prints "
        "a new key once and appends its hash); read at start, and a bad file refuses to start.",
        groups="auth keys",
    )
    keys: str = setting(
        "",
        "API keys as a secret: the keys file's YAML or JSON content inline (for a "
        "Kubernetes secret in FLEETSERVE_KEYS); combined with keys_file if both are set.",
        secret=True,
        groups="auth",
    )
    # -- adapters (LoRA) --------------------------------------------------------------
    adapter_store: str = setting(
        "",
        "Where uploaded adapters live (the cold tier): a store URL like --payload-store "
        "(empty: nats://fleetserve-adapters in distributed mode, else a directory under "
        "--cache-dir).",
        groups="adapters",
    )
    adapter_cache_bytes: str = setting(
        "2GiB", "Local disk for adapters (the warm tier, under --cache-dir); least recently "
        "used leave first.",
        groups="adapters",
    )  # fmt: skip
    adapter_hot_bytes: str = setting(
        "10%", "Memory for loaded adapters per worker (the hot tier): a size or a percent of "
        "the memory budget; least recently used leave first.",
        groups="adapters",
    )  # fmt: skip
    adapter_hosts: str = setting(
        "eager", "eager: a model loaded at start whose profile runs on OpenVINO also makes "
        "its graph with LoRA slots then (on ONNX: loads its torch copy for adapter batches), "
        "so a first upload serves at once; lazy: on its first adapter request.",
        groups="adapters",
    )  # fmt: skip
    lora_in_graph: bool = setting(
        True, "Run adapters inside the OpenVINO graph of a base served on OpenVINO (LoRA "
        "slots, one per adapter a batch may mix) rather than on a torch copy of it.",
        groups="adapters",
    )  # fmt: skip
    max_adapters_per_batch: int = setting(
        16,
        "Distinct adapters one batch may mix (1: one adapter per batch, as SIE does).",
        groups="adapters",
    )
    config: str = setting(
        "", "Optional YAML config file with any of these settings.", groups="common"
    )
    # -- tracing: OpenTelemetry spans across the queue (the otel extra) --------------
    tracing: bool = setting(
        False, "OpenTelemetry spans for each request: gateway, queue wait, worker batch and "
        "reply, one trace across processes (needs the otel extra; off costs nothing)."
    )  # fmt: skip
    otlp_endpoint: str = setting(
        "", "OTLP/HTTP collector for --tracing, e.g. http://127.0.0.1:4318 (the "
        "otel extra; empty: spans go to stderr, one JSON line each)."
    )  # fmt: skip
    service_name: str = setting(
        "", "OpenTelemetry service.name of this process (empty: fleetserve-gateway, "
        "fleetserve-worker or fleetserve-server)."
    )  # fmt: skip
    trace_sample_ratio: float = setting(
        1.0, "Fraction of new traces kept (0 to 1); a client's traceparent decides for its own."
    )
    # -- distributed mode: gateways and workers over NATS JetStream -----------------
    nats: str = setting(
        "",
        "NATS URL of the central queue, e.g. nats://127.0.0.1:4222.",
        secret=True,
        groups="nats",
    )
    nats_connect_timeout: float = setting(
        30.0,
        "Seconds to keep retrying an unreachable NATS URL at start.",
        groups="nats",
    )
    queue_prefix: str = setting(
        "fleetserve", "Subject and stream prefix: one per fleet.", groups="nats"
    )
    stream_storage: str = setting(
        "file", "JetStream storage for the streams: file or memory.", groups="nats"
    )
    stream_replicas: int = setting(
        1,
        "JetStream replicas of each stream: 3 on a clustered NATS keeps queued work"
        " through the loss of a server.",
        groups="nats",
    )
    stream_max_bytes: int = setting(
        -1, "Work stream size limit in bytes (-1: none).", groups="nats"
    )
    stream_max_age: float = setting(
        3600.0, "Seconds a request may stay in the work stream.", groups="nats"
    )
    max_deliver: int = setting(
        5,
        "Deliveries before a failing request goes to the dead-letter stream.",
        groups="runtime nats",
    )
    ack_wait: float = setting(
        0.0,
        "Seconds before unacked work is redelivered (0: sized from the model profile).",
        groups="nats",
    )
    devices: str = setting(
        "",
        "Worker devices, e.g. cpu:0,cpu:1 or cuda:0,cuda:1: one process per device.",
        groups="pool",
    )
    fork_workers: bool = setting(
        True,
        "fleetserve cluster: start each worker as a fork of one process that has imported "
        "torch and transformers already (a worker's start and its restart after a crash "
        "skip ~3 CPU-seconds of imports); off: each worker is a fresh interpreter.",
        groups="pool",
    )
    worker_id: str = setting(
        "", "This worker's name in /v1/models (empty: host-pid).", groups="pool"
    )
    worker_port: int = setting(
        0, "Port of a worker's /healthz, /readyz and /metrics (0: free).", groups="pool"
    )
    offload_threshold: int = setting(
        1 << 20,
        "Bodies and results larger than this (bytes) go to the payload store.",
        groups="payloads",
    )
    payload_store: str = setting(
        "",
        "Payload store URL: nats://BUCKET, file:///DIR, memory:// or s3://BUCKET/PREFIX "
        "(empty: nats://fleetserve-payloads in distributed mode).",
        groups="payloads",
    )
    payload_ttl: float = setting(
        3600.0, "Seconds after which orphaned payloads are swept.", groups="payloads"
    )
    s3_endpoint: str = setting(
        "", "S3 endpoint URL for s3:// payload stores (e.g. MinIO).", groups="s3"
    )
    s3_region: str = setting("", "S3 region for s3:// payload stores.", groups="s3")
    s3_access_key_id: str = setting("", "S3 access key id.", secret=True, groups="s3")
    s3_secret_access_key: str = setting("", "S3 secret access key.", secret=True, groups="s3")

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.metadata.get("secret") and v:
                v = "***"
            parts.append(f"{f.name}={v!r}")
        return f"Settings({', '.join(parts)})"

    def model_list(self) -> list[str]:
        return [m.strip() for m in self.models.split(",") if m.strip()]

    def model_root_list(self) -> list[str]:
        return [r.strip() for r in self.model_roots.split(",") if r.strip()]

    def device_list(self) -> list[str]:
        return [d.strip() for d in self.devices.split(",") if d.strip()]

    def to_env(self) -> dict[str, str]:
        """``FLEETSERVE_*`` variables for the fields that differ from their defaults,
        so that child processes (``fleetserve cluster``) get the same settings."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "config" and v != f.default:
                out[self.env_name(f.name)] = str(v)
        if self.config:
            out[self.env_name("config")] = self.config
        return out

    @staticmethod
    def env_name(name: str) -> str:
        return env_name(name)

    @staticmethod
    def flag_name(f: dataclasses.Field[object]) -> str:
        return flag_name(f)

    @classmethod
    def add_arguments(
        cls,
        parser: argparse.ArgumentParser,
        groups: Iterable[str] | None = None,
        shown: Collection[str] | None = None,
    ) -> int:
        """Add one flag per field (of ``groups`` only, if given: what the command uses,
        under a heading per group); unset flags stay ``None`` so lower layers show
        through. ``--help`` lists only ``shown`` (None: all); how many it leaves out."""
        return add_arguments(fields(cls), parser, groups, shown)

    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        cli: Mapping[str, object] | None = None,
        overrides: Mapping[str, object] | None = None,
    ) -> Settings:
        """Layer defaults, config file, environment, CLI flags, then explicit overrides."""
        return cls(**layered(fields(cls), env, cli, overrides))

    @classmethod
    def describe(cls) -> list[tuple[str, str, str, str]]:
        """(field, env, flag, help) rows for docs and ``--help``."""
        return [
            (f.name, cls.env_name(f.name), cls.flag_name(f), str(f.metadata["help"]))
            for f in fields(cls)
        ]


__all__ = ["ENV_PREFIX", "Settings", "setting"]
