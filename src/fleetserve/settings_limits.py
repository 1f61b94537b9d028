"""The limits that keep one client, upload or broker fault from taking the process down.

These fields are part of the one ``Settings`` object (it inherits them); they live here
so that ``settings.py`` stays the list of what a deployment chooses, and this file the
list of what bounds it. Each field declares its env variable, flag and help as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings_fields import setting


@dataclass(frozen=True)
class Limits:
    """Bounds on HTTP parsing, request size, uploads, keep-alive, sleeping models and
    training input."""

    # -- memory for sleeping models (the fleet's host tier) ----------------------------
    host_tier: str = setting(
        "100%",
        "Memory for sleeping models (the host tier): under pressure a model that can sleep "
        "(torch on a CPU) lets its weights go from the memory budget and keeps them in "
        "a mapped file the page cache holds, to wake in milliseconds; bytes, a size or a "
        "percent of --memory-budget; 0 or off: evicted models unload.",
        groups="runtime",
    )

    # -- sizes of bodies, uploads and training texts -----------------------------------
    max_body_bytes: int = setting(
        16 * 1024 * 1024, "Largest accepted request body (bytes).", groups="gateway"
    )
    max_adapter_rank: int = setting(64, "Largest LoRA rank an upload may have.", groups="adapters")
    max_adapter_bytes: int = setting(
        256 * 1024 * 1024,
        "Largest adapter upload (bytes of adapter_model.safetensors).",
        groups="adapters",
    )
    max_adapters_per_tenant: int = setting(
        100, "Adapters (all versions) one tenant may hold.", groups="adapters"
    )
    train_max_chars: int = setting(
        2000,
        "Longest text (characters) of a training file: a longer one is a 400 naming its "
        "line, or cut to this when the upload says truncate=true.",
        groups="training",
    )
    max_file_bytes: int = setting(
        100 * 1024 * 1024, "Largest upload to /v1/files (bytes).", groups="training"
    )

    # -- HTTP parsing and connections (every HTTP server: http_limits.py) -------------
    http_max_header_bytes: int = setting(
        64 * 1024, "Largest request head (request line and headers, bytes); beyond: 431 and "
        "the connection closed. 0: no limit.",
        groups="http pool",
    )  # fmt: skip
    http_max_headers: int = setting(
        100, "Most header fields in one request; beyond: 431. 0: no limit.", groups="http pool"
    )
    http_max_url_bytes: int = setting(
        8 * 1024, "Longest request target (path and query, bytes); beyond: 414. 0: no limit.",
        groups="http pool",
    )  # fmt: skip
    http_header_timeout: float = setting(
        10.0, "Seconds a client has to send a request's head, counted from its first byte "
        "(or from connecting); beyond: 408 and the connection closed. 0: no limit.",
        groups="http pool",
    )  # fmt: skip
    http_body_timeout: float = setting(
        30.0, "Seconds a request body may go without a byte arriving (while the server "
        "reads it); beyond: 408 and the connection closed. 0: no limit.",
        groups="http pool",
    )  # fmt: skip
    http_keepalive_timeout: float = setting(
        15.0, "Seconds an idle kept-alive connection stays open. Keep it above the idle "
        "expiry of the clients and balancers in front (httpx's is 5 s): a request sent on "
        "a connection as the server closes it fails with a connection error, unanswered.",
        groups="http pool",
    )  # fmt: skip
    http_max_connections: int = setting(
        1024, "Open connections one HTTP server holds; beyond: 503 and closed. 0: no limit.",
        groups="http pool",
    )  # fmt: skip

    # -- uploads (/v1/adapters, /v1/files): spooled to disk, bounded ------------------
    max_uploads: int = setting(
        8, "Uploads (adapters and files) one gateway receives at once; beyond: 503.",
        groups="adapters",
    )  # fmt: skip
    max_uploads_per_tenant: int = setting(
        2, "Uploads one tenant sends at once; beyond: 429.", groups="adapters"
    )
    max_safetensors_header_bytes: int = setting(
        4 * 1024 * 1024,
        "Largest JSON header an uploaded adapter_model.safetensors may declare (bytes).",
        groups="adapters",
    )

    # -- keep-alive (X-Keep-Alive: gateway/keepalive.py) --------------------------------
    max_keep_alive: float = setting(
        3600.0, "Longest X-Keep-Alive a request may ask (seconds); longer asks are cut to it "
        "(a model spec's max_keep_alive may lower it). 0: requests keep no model alive.",
        groups="gateway",
    )  # fmt: skip
    max_kept_alive_per_tenant: int = setting(
        2, "Models one tenant may keep alive with X-Keep-Alive at once; a request beyond "
        "gets none (X-Keep-Alive-Applied: 0; the model's own keep_alive still holds). "
        "0: no limit.",
        groups="gateway",
    )  # fmt: skip

    # -- request parsing (wire/bounds.py, gateway/request_limits.py): bodies and deadlines -
    max_nesting_depth: int = setting(
        64, "Deepest nesting of arrays and objects in a JSON or msgpack body; deeper: 400.",
        groups="gateway",
    )  # fmt: skip
    max_items: int = setting(
        2048, "Most inputs (texts, documents, items, messages) in one inference request; "
        "more: 413 naming max_items (GET /v1/models advertises it; the SDK chunks within).",
        groups="gateway",
    )  # fmt: skip
    max_item_bytes: int = setting(
        1024 * 1024, "Largest single input (a text, document, message, query or prompt) as "
        "encoded in the body (bytes); larger: 413 naming max_item_bytes. Images have "
        "their model's max_image_bytes instead.",
        groups="gateway",
    )  # fmt: skip
    request_memory: str = setting(
        "512MiB", "Memory for the requests in flight, apart from --memory-budget: each "
        "request reserves its body's bytes times 7 before anything decodes it; a full "
        "budget answers 503 (Retry-After), a request larger than it alone 413. Bytes or a "
        "size (256MiB); 0: no budget.",
        groups="gateway",
    )  # fmt: skip
    max_request_timeout: float = setting(
        3600.0, "Longest deadline X-Request-Timeout may ask (seconds); a longer ask is cut "
        "to it. Not finite or not positive: 400. 0: no cap.",
        groups="gateway",
    )  # fmt: skip
    stop_grace: float = setting(
        25.0, "Seconds the requests in flight may take to finish when the server stops "
        "(SIGTERM, Ctrl-C); those still running then get 503 with Retry-After, or a stream "
        "its error event (Kubernetes sends SIGKILL 30 s after SIGTERM by default). 0: no "
        "limit.",
        groups="gateway",
    )  # fmt: skip

    # -- the broker (queue/js_health.py): JetStream refusing writes ---------------------
    queue_probe_interval: float = setting(
        2.0, "Seconds between write probes of the JetStream work stream (every second "
        "while it refuses writes): /readyz is 503 while JetStream stores nothing (a full "
        "disk), and 200 again once it does. 0: no probes.",
        groups="nats",
    )  # fmt: skip

    # -- fine-tuning job ownership (lora/jobs/leases.py): servers sharing a store -----
    train_lease_ttl: float = setting(
        30.0, "Seconds an embedded server's lease on a fine-tuning job lasts unrenewed "
        "(renewed every third of it): servers sharing a cache directory take up only jobs "
        "whose lease is free or this stale (their server died).",
        groups="training",
    )  # fmt: skip

    # -- training input and the training process (lora/pairs.py, lora/train/child.py) -
    train_max_line_bytes: int = setting(
        1024 * 1024, "Longest line of a training file (bytes); a longer one is a 400 naming "
        "it, read no further (truncate=true or not).",
        groups="training",
    )  # fmt: skip
    train_memory_limit: str = setting(
        "75%", "Memory a training job's process may take (its data segment, RLIMIT_DATA: "
        "what it reserves, above what it touches): a size (4GiB, 800MiB), a percent of the "
        "machine's (or cgroup's) memory, or 0 for none. A job over it fails, saying so.",
        groups="training",
    )  # fmt: skip
    train_memory_share: str = setting(
        "25%", "What a training job's process may grow by, charged to --memory-budget "
        "while it runs: a size (1GiB, 600MiB), a percent of the budget, or 0 for none. "
        "The job makes room for it as a load does (idle models are evicted) or waits for "
        "room; the trainer runs its batch in micro-batches that fit (sentence-transformers' "
        "cached loss: the in-batch negatives stay the batch's), and cuts its sequences if "
        "one does not.",
        groups="training",
    )  # fmt: skip


__all__ = ["Limits", "setting"]
