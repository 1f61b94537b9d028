"""What a server does besides serving: tuning its models and training adapters.

These fields are part of the one ``Settings`` object (it inherits them), as the limits
in ``settings_limits.py`` are; each declares its env variable, flag and help as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings_fields import setting


@dataclass(frozen=True)
class Background:
    """The background tuner (``--tune auto``) and fine-tuning jobs."""

    # -- tuning (--tune auto, quick, off) -----------------------------------------------
    tune: str = setting(
        "auto",
        "auto: serve at once on the rules' choice and tune each untuned model in the "
        "background while the server is idle, swapping in what wins; quick: tune each "
        "untuned pinned model briefly before serving; off: use the rules.",
        groups="quick",
    )
    tune_budget: float = setting(
        60.0,
        "Seconds of tuning per model for --tune quick, and for --tune auto's first, quick search.",
        groups="quick",
    )
    tune_refine_budget: float = setting(
        600.0,
        "Seconds of tuning per model for --tune auto's full search, which refines the "
        "quick one (0: none).",
        groups="quick",
    )
    tune_lease: float = setting(
        15.0,
        "Seconds a worker's tune lease lasts unrenewed (--tune auto, distributed: one "
        "worker per class and model tunes; a killed one's lease is taken over after this).",
        groups="quick",
    )
    tune_idle: float = setting(
        1.0,
        "Seconds without requests before --tune auto's background tune continues (it "
        "stops the moment a request comes).",
        groups="quick",
    )
    tune_lock: str = setting(
        "",
        "The file whose lock lets one --tune auto process on this host tune at a time "
        "(co-located workers take turns) [empty: fleetserve-tune.lock in the temporary "
        "directory].",
        groups="quick",
    )
    # -- fine-tuning jobs (/v1/files, /v1/fine_tuning/jobs) -------------------------
    train: bool = setting(
        False, "This worker also runs fine-tuning jobs (distributed mode; the embedded "
        "server always does).",
        groups="pool",
    )  # fmt: skip
    train_threads: int = setting(
        1,
        "CPU threads of a training job's process; serving keeps the rest.",
        groups="training",
    )
    train_min_pairs: int = setting(
        32, "Fewest distinct pairs a training file may hold.", groups="training"
    )
    train_margin: float = setting(
        0.01, "nDCG@10 gain over the base a trained adapter must show to be registered "
        "(a job's margin overrides it).",
        groups="training",
    )  # fmt: skip
    train_miner: str = setting(
        "sentence-transformers/all-MiniLM-L6-v2",
        "The catalog's bi-encoder that a reranker's job (a cross-encoder base) mines hard "
        "negatives with and retrieves the held-out queries' candidates with.",
        groups="training",
    )
    train_validation_fraction: float = setting(
        0.2,
        "Fraction of the queries held out to measure a job without a validation_file.",
        groups="training",
    )
    train_max_attempts: int = setting(
        3,
        "Times a job is started (after a worker died, it resumes) before it fails.",
        groups="training",
    )
    train_ack_wait: float = setting(
        30.0,
        "Seconds without news before a training job is redelivered to another worker.",
        groups="training",
    )
    train_max_queued: int = setting(100, "Jobs that may wait for a trainer.", groups="training")
    train_price_per_hour: float = setting(
        0.0,
        "What a machine-hour costs (USD), to report each job's cost (0: not reported).",
        groups="training",
    )
