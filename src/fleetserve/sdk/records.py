"""The shapes of the records the SDK returns: decoded JSON objects, typed for the
reader (the server writes them: ``wire.finetune``'s ``to_dict``s for fine-tuning,
``lora.manifest.AdapterRecord.to_dict`` for adapters)."""

from __future__ import annotations

from typing import Any, TypedDict, cast

from ..wire.json_value import JSON, JSONObject


class AdapterInfo(TypedDict):
    """An adapter version (``/v1/adapters``); call it as ``model``."""

    object: str  # "adapter"
    id: str  # tenant/name@version
    tenant: str
    name: str
    version: int | None
    base: str
    model: str  # base:tenant/name@version
    rank: int
    alpha: float
    scaling: float
    target_modules: list[str]
    dtype: str  # F32, F16 or BF16
    sha256: str
    bytes: int
    created: float  # epoch seconds
    pinned: bool


class FileObject(TypedDict):
    """An uploaded file of pairs (``/v1/files``)."""

    id: str
    object: str  # "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str
    rows: int  # pairs kept, after deduplication
    duplicates: int
    warnings: list[str]
    owner: str


class FineTuningJob(TypedDict):
    """A fine-tuning job (``/v1/fine_tuning/jobs``); ``result`` holds its figures once
    measured, ``error`` its ``{code, message, field}`` once failed."""

    id: str
    object: str  # "fine_tuning.job"
    model: str
    organization_id: str
    created_at: int
    started_at: int | None
    finished_at: int | None
    status: str
    training_file: str
    validation_file: str | None
    validation_fraction: float
    margin: float
    seed: int
    hyperparameters: JSONObject
    suffix: str
    fine_tuned_model: str | None  # "base:tenant/suffix@N" once registered
    registered: bool
    error: JSONObject | None
    result: JSONObject | None
    attempts: int
    trainer: str | None
    result_files: list[JSON]


class FineTuningEvent(TypedDict):
    """One line of a job's feed; ``data`` e.g. ``{"step", "steps", "loss"}``."""

    id: str
    object: str  # "fine_tuning.job.event"
    created_at: int
    level: str
    message: str
    type: str  # "message", "metrics", "status"
    data: JSONObject | None


# the decoders of replies: the server's word for their shape (nothing is checked)
def adapter(reply: Any) -> AdapterInfo:
    return cast(AdapterInfo, dict(reply))


def adapter_list(reply: Any) -> list[AdapterInfo]:
    return cast(list[AdapterInfo], list(reply["data"]))


def file_object(reply: Any) -> FileObject:
    return cast(FileObject, dict(reply))


def file_list(reply: Any) -> list[FileObject]:
    return cast(list[FileObject], list(reply["data"]))


def job(reply: Any) -> FineTuningJob:
    return cast(FineTuningJob, dict(reply))


__all__ = [
    "AdapterInfo",
    "FileObject",
    "FineTuningEvent",
    "FineTuningJob",
    "adapter",
    "adapter_list",
    "file_list",
    "file_object",
    "job",
]
