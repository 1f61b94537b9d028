"""Fine-tuning jobs in OpenAI's shape: files of pairs, jobs, their events.

- A **file** (``file-…``) is a validated JSONL upload of ``{query, positive,
  negative?}`` rows, owned by a tenant.
- A **job** (``ftjob-…``) trains a LoRA on a base model from a training file (and a
  validation file, or a held-out fraction of the pairs), measures it against the
  base and registers it as ``tenant/suffix@vN`` when it beats the base by the margin.
- An **event** is one line of a job's feed: a state change, training progress, the
  figures.

These are plain records (``to_dict``/``from_dict``) so that the gateway, the worker
that trains and the store that keeps them between the two share one vocabulary.
"""

from __future__ import annotations

import enum
import math
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .adapter_ids import NAME_RE
from .errors import InvalidInput

PURPOSE = "fine-tune"


def new_id(prefix: str) -> str:
    """``file-…`` or ``ftjob-…``: the time in milliseconds (hex, so ids sort in the
    order they were made) and 12 random hex digits."""
    return f"{prefix}-{int(time.time() * 1000):011x}{secrets.token_hex(6)}"


class JobStatus(enum.StrEnum):
    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


# name -> (type, low, high): the accepted range of each hyperparameter
RANGES: dict[str, tuple[type, float, float]] = {
    "rank": (int, 1, 64),
    "alpha": (float, 0.5, 1024),
    "epochs": (int, 1, 50),
    "learning_rate": (float, 1e-7, 0.1),
    "batch_size": (int, 2, 512),
    "hard_negatives": (int, 0, 4),
}
ALIASES = {"n_epochs": "epochs"}  # OpenAI's name for it


@dataclass(frozen=True, slots=True)
class Hyperparameters:
    """What a job trains with. ``hard_negatives``: negatives per pair, the pair's own
    first, then mined with the base model (0, the default: in-batch negatives and the
    pairs' own; on the FAQ demonstration that was as good or better, and faster)."""

    rank: int = 16
    alpha: float = 32.0
    epochs: int = 3
    learning_rate: float = 1e-3
    batch_size: int = 32
    hard_negatives: int = 0

    @classmethod
    def from_dict(cls, raw: object, *, max_rank: int = 64) -> Hyperparameters:
        """Checked: an ``InvalidInput`` naming ``hyperparameters.<field>`` for an
        unknown field, a wrong type or a value out of range."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise InvalidInput("hyperparameters must be an object", field="hyperparameters")
        values: dict[str, Any] = {}
        for key, value in raw.items():
            name = ALIASES.get(str(key), str(key))
            where = f"hyperparameters.{key}"
            if name not in RANGES and name != "learning_rate_multiplier":
                raise InvalidInput(
                    f"unknown hyperparameter {key!r}; accepted: {', '.join(RANGES)}", field=where
                )
            if value == "auto":  # OpenAI's clients send it for "the default"
                continue
            if name == "learning_rate_multiplier":  # OpenAI's: times the default rate
                m = _number(value, float, 0.01, 100.0, where)
                values["learning_rate"] = _number(
                    cls().learning_rate * m, float, *RANGES["learning_rate"][1:], where
                )
                continue
            kind, low, high = RANGES[name]
            if name == "rank":
                high = min(high, max_rank)
            values[name] = _number(value, kind, low, high, where)
        if "alpha" not in values and "rank" in values:
            values["alpha"] = float(2 * values["rank"])  # the usual alpha = 2 * rank
        return cls(**values)

    def to_dict(self) -> dict[str, object]:
        """The fields, and ``n_epochs`` as OpenAI's clients read it."""
        return {**asdict(self), "n_epochs": self.epochs}


def _number(value: Any, kind: type, low: float, high: float, where: str) -> float | int:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and kind is int and float(value) != int(value):
        ok = False
    if not ok or not math.isfinite(float(value)):
        raise InvalidInput(
            f"{where} must be {'an integer' if kind is int else 'a number'}, not {value!r}",
            field=where,
        )
    if not low <= value <= high:
        raise InvalidInput(
            f"{where} must be between {low:g} and {high:g}, not {value}", field=where
        )
    return int(value) if kind is int else float(value)


def check_suffix(suffix: object) -> str:
    """The adapter name the job registers (``tenant/suffix@vN``)."""
    if not isinstance(suffix, str) or NAME_RE.fullmatch(suffix) is None:
        raise InvalidInput(
            f"suffix {suffix!r} must be 1 to 128 letters, digits, '.', '-' or '_', "
            "starting with a letter or digit",
            field="suffix",
        )
    return suffix


@dataclass(frozen=True, slots=True)
class Pair:
    """One training row: a query, the passage that answers it, and optional negatives
    (passages that do not)."""

    query: str
    positive: str
    negatives: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"query": self.query, "positive": self.positive}
        if self.negatives:
            out["negative"] = list(self.negatives)
        return out


@dataclass(frozen=True, slots=True)
class FileInfo:
    """An uploaded, validated file of pairs."""

    id: str
    tenant: str
    filename: str
    bytes: int
    rows: int  # pairs kept, after deduplication
    created_at: int
    duplicates: int = 0  # rows dropped as repeats
    warnings: tuple[str, ...] = ()  # e.g. "line 7: positive was 9,120 characters; cut to 2,000"
    purpose: str = PURPOSE

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "rows": self.rows,
            "duplicates": self.duplicates,
            "warnings": list(self.warnings),
            "owner": self.tenant,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FileInfo:
        return cls(
            id=d["id"],
            tenant=d["owner"],
            filename=d["filename"],
            bytes=int(d["bytes"]),
            rows=int(d["rows"]),
            created_at=int(d["created_at"]),
            duplicates=int(d.get("duplicates", 0)),
            warnings=tuple(d.get("warnings", ())),
            purpose=d.get("purpose", PURPOSE),
        )


@dataclass(frozen=True, slots=True)
class Job:
    """A fine-tuning job's record; ``result`` holds the figures once measured."""

    id: str
    tenant: str
    model: str
    training_file: str
    suffix: str
    hyperparameters: Hyperparameters = field(default_factory=Hyperparameters)
    validation_file: str | None = None
    validation_fraction: float = 0.2
    margin: float = 0.01  # the nDCG@10 gain over the base the adapter must show
    seed: int = 0
    status: JobStatus = JobStatus.VALIDATING_FILES
    created_at: int = field(default_factory=lambda: int(time.time()))
    started_at: int | None = None
    finished_at: int | None = None
    fine_tuned_model: str | None = None  # "base:tenant/suffix@N" once registered
    error: dict[str, Any] | None = None  # {"code", "message", "field"} when failed
    result: dict[str, Any] | None = None  # figures: base, adapter, gain, registered...
    attempts: int = 0  # times a worker started it (a redelivery resumes or restarts)
    owner: str | None = None  # the token of the trainer that holds it while it runs

    def with_(self, **changes: Any) -> Job:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "object": "fine_tuning.job",
            "model": self.model,
            "organization_id": self.tenant,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "status": self.status.value,
            "training_file": self.training_file,
            "validation_file": self.validation_file,
            "validation_fraction": self.validation_fraction,
            "margin": self.margin,
            "seed": self.seed,
            "hyperparameters": self.hyperparameters.to_dict(),
            "suffix": self.suffix,
            "fine_tuned_model": self.fine_tuned_model,
            "registered": bool(self.result and self.result.get("registered")),
            "error": self.error,
            "result": self.result,
            "attempts": self.attempts,
            "trainer": self.owner,
            "result_files": [],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        return cls(
            id=d["id"],
            tenant=d["organization_id"],
            model=d["model"],
            training_file=d["training_file"],
            suffix=d["suffix"],
            hyperparameters=Hyperparameters(
                **{k: v for k, v in d["hyperparameters"].items() if k != "n_epochs"}
            ),
            validation_file=d.get("validation_file"),
            validation_fraction=float(d.get("validation_fraction", 0.2)),
            margin=float(d.get("margin", 0.01)),
            seed=int(d.get("seed", 0)),
            status=JobStatus(d["status"]),
            created_at=int(d["created_at"]),
            started_at=d.get("started_at"),
            finished_at=d.get("finished_at"),
            fine_tuned_model=d.get("fine_tuned_model"),
            error=d.get("error"),
            result=d.get("result"),
            attempts=int(d.get("attempts", 0)),
            owner=d.get("trainer"),
        )


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One line of a job's feed. ``data``: e.g. ``{"step", "steps", "loss"}``."""

    seq: int
    created_at: float
    message: str
    level: str = "info"
    type: str = "message"  # "message", "metrics" (training progress), "status"
    data: dict[str, Any] | None = None

    def to_dict(self, job_id: str) -> dict[str, object]:
        return {
            "id": f"ftevent-{job_id.removeprefix('ftjob-')}-{self.seq}",
            "object": "fine_tuning.job.event",
            "created_at": int(self.created_at),
            "level": self.level,
            "message": self.message,
            "type": self.type,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobEvent:
        seq = int(str(d["id"]).rsplit("-", 1)[-1])
        return cls(seq, float(d["created_at"]), d["message"], d["level"], d["type"], d.get("data"))
