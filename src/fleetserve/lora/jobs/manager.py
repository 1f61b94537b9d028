"""The fine-tuning API behind ``/v1/files`` and ``/v1/fine_tuning/jobs``.

:class:`FineTuning` takes files (checked whole before anything is kept), creates jobs
(checked against the catalog and the caller's files before one is queued), lists
them, feeds their events and cancels them. It never trains: a job is put on the
:class:`~.queue.JobQueue`, and whichever :class:`~.runner.JobRunner` takes it (this
process's, or a worker's started with ``--train``) writes its progress to the
:class:`~.store.JobStore`, which is where this class reads it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...settings import Settings
from ...wire import Conflict, Forbidden, InvalidInput, Overloaded, Principal, Scope, Unavailable
from ...wire.finetune import (
    FileInfo,
    Hyperparameters,
    Job,
    JobEvent,
    JobStatus,
    check_suffix,
    new_id,
)
from ..pairs import check_bytes, check_file, one_query, split_by_query
from ..pairs_check import MAX_WARNINGS, Checked
from ..train.spec import EMBED, RERANK
from .queue import JobQueue, JobRef
from .store import JobStore

RERANKER_FAMILY = "cross_encoder"  # a base of this family trains as a reranker
# a job's task (a run's kind, ``TrainSpec.kind``): the family of base it trains
TASKS = {EMBED: "dense", RERANK: RERANKER_FAMILY}
TRAINABLE = tuple(TASKS.values())  # families a job can train
# a reranker's negatives per pair when the job does not say: its own, then mined (a
# reranker reorders what a retriever found, so it learns from those near misses; it
# has no in-batch negatives to fall back on)
RERANK_HARD_NEGATIVES = 3
JOB_FIELDS = (
    "model", "training_file", "validation_file", "hyperparameters", "suffix",
    "validation_fraction", "margin", "seed", "task",
)  # fmt: skip
CANCEL_WAIT = 5.0  # seconds a cancel waits for the trainer to stop a running job


@dataclass(frozen=True)
class TrainLimits:
    min_pairs: int = 32
    max_chars: int = 2000
    max_line_bytes: int = 1 << 20
    max_rank: int = 64
    margin: float = 0.01
    validation_fraction: float = 0.2

    @classmethod
    def from_settings(cls, settings: Settings) -> TrainLimits:
        return cls(
            min_pairs=int(settings.train_min_pairs),
            max_chars=int(settings.train_max_chars),
            max_line_bytes=int(settings.train_max_line_bytes),
            max_rank=int(settings.max_adapter_rank),
            margin=float(settings.train_margin),
            validation_fraction=float(settings.train_validation_fraction),
        )


async def add_event(store: JobStore, job: Job, message: str, **kw: Any) -> None:
    """Append one event to ``job``'s feed (its writer's side: one writer at a time)."""
    events = await store.events(job.tenant, job.id)
    seq = events[-1].seq + 1 if events else 1
    events.append(JobEvent(seq, time.time(), message, **kw))
    await store.put_events(job.tenant, job.id, events)


class FineTuning:
    def __init__(
        self,
        store: JobStore,
        queue: JobQueue,
        family: Callable[[str], str | None],
        limits: TrainLimits | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.family = family  # a catalog model's family, None for an unknown one
        self.limits = limits or TrainLimits()

    # -- files --------------------------------------------------------------------------
    async def create_file(
        self, principal: Principal, filename: str, raw: bytes | Path, *, truncate: bool = False
    ) -> FileInfo:
        """Check ``raw`` (bytes, or a file on disk: read a line at a time, never whole)
        and keep its pairs; a text over ``max_chars`` is a 400 naming its line, or with
        ``truncate`` cut to ``max_chars`` (in the warnings)."""
        _can_write(principal)
        limits: dict[str, object] = {
            "min_pairs": self.limits.min_pairs, "max_chars": self.limits.max_chars,
            "truncate": truncate, "max_line_bytes": self.limits.max_line_bytes,
        }  # fmt: skip
        if isinstance(raw, Path):
            checked, kept = await asyncio.to_thread(check_file, raw, **limits)
            try:
                size = (await asyncio.to_thread(raw.stat)).st_size
                info = self._info(principal, filename, size, checked)
                await self.store.put_file(info, kept, two_queries=checked.two_queries)
            finally:  # moved into a file store; copied into any other
                await asyncio.to_thread(kept.unlink, missing_ok=True)
            return info
        checked, pairs = await asyncio.to_thread(check_bytes, raw, **limits)
        info = self._info(principal, filename, len(raw), checked)
        await self.store.put_file(info, pairs, two_queries=checked.two_queries)
        return info

    @staticmethod
    def _info(principal: Principal, filename: str, size: int, checked: Checked) -> FileInfo:
        return FileInfo(
            id=new_id("file"),
            tenant=principal.tenant,
            filename=filename or "pairs.jsonl",
            bytes=size,
            rows=checked.rows,
            created_at=int(time.time()),
            duplicates=checked.duplicates,
            warnings=checked.warnings[:MAX_WARNINGS],
        )

    async def files(self, principal: Principal) -> list[FileInfo]:
        """The caller's files; an admin key's: every tenant's."""
        return await self.store.files(None if _admin(principal) else principal.tenant)

    async def file(self, principal: Principal, file_id: str) -> FileInfo:
        return await self.store.file(await self._tenant_of(principal, "files", file_id), file_id)

    # -- jobs ---------------------------------------------------------------------------
    async def create_job(self, principal: Principal, body: object) -> Job:
        """Check everything, then queue: a 400 or 404 starts nothing."""
        _can_write(principal)
        if not isinstance(body, dict):
            raise InvalidInput("the job must be a JSON object", field="body")
        unknown = sorted(str(k) for k in body if k not in JOB_FIELDS)
        if unknown:
            raise InvalidInput(
                f"unknown field {unknown[0]!r}; accepted: {', '.join(JOB_FIELDS)}",
                field=unknown[0],
            )
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidInput("field model (the base model's id) is required", field="model")
        family = self.family(model)
        if family is None:
            raise InvalidInput(f"unknown base model {model!r}: not in the catalog", field="model")
        _check_task(body.get("task"), model, family)
        hp = Hyperparameters.from_dict(body.get("hyperparameters"), max_rank=self.limits.max_rank)
        fraction = _fraction(body.get("validation_fraction"), self.limits.validation_fraction)
        margin = _margin(body.get("margin"), self.limits.margin)
        seed = body.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise InvalidInput("seed must be an integer from 0 to 2**32 - 1", field="seed")
        job_id = new_id("ftjob")
        suffix = check_suffix(body.get("suffix") or f"ft-{job_id[-8:]}")  # the random part
        training = _file_id(body.get("training_file"), "training_file", required=True) or ""
        validation = _file_id(body.get("validation_file"), "validation_file")
        await self.store.file(principal.tenant, training)  # 404: not the caller's
        if validation == training:
            raise InvalidInput(
                "validation_file is the training file: hold out other pairs, or leave it "
                "out and validation_fraction of the queries is held out",
                field="validation_file",
            )
        if validation is not None:
            await self.store.file(principal.tenant, validation)
        else:  # a 400 now if nothing can be held out
            await self._can_hold_out(principal.tenant, training, fraction)
        if family == RERANKER_FAMILY:
            hp = await self._reranker(principal.tenant, body.get("hyperparameters"), hp, training)
        job = Job(
            id=job_id, tenant=principal.tenant, model=model, training_file=training,
            suffix=suffix, hyperparameters=hp, validation_file=validation,
            validation_fraction=fraction, margin=margin, seed=seed,
        )  # fmt: skip
        await self.store.put_job(job)
        await add_event(self.store, job, f"created fine-tuning job {job.id}", type="status")
        job = job.with_(status=JobStatus.QUEUED)
        await self.store.put_job(job)
        await add_event(self.store, job, "files validated; job queued", type="status")
        try:
            await self.queue.submit(JobRef(job.tenant, job.id))
        except (Overloaded, Unavailable) as exc:  # never left "queued" with no message
            error = {"code": exc.code, "message": exc.message, "field": None, "param": None}
            failed = job.with_(status=JobStatus.FAILED, error=error, finished_at=int(time.time()))
            await add_event(self.store, failed, exc.message, level="error", type="status")
            await self.store.put_job(failed)
            raise
        return job

    async def _can_hold_out(self, tenant: str, file_id: str, fraction: float) -> None:
        """A 400 if the file's pairs ask one query, as its record says (the pairs are
        read only for a file whose record does not say: one kept before it did)."""
        two = await self.store.two_queries(tenant, file_id)
        if two is None:
            pairs = await self.store.pairs(tenant, file_id)
            await asyncio.to_thread(split_by_query, pairs, fraction)
        elif not two:
            raise one_query()

    async def _reranker(
        self, tenant: str, raw: object, hp: Hyperparameters, training: str
    ) -> Hyperparameters:
        """A reranker's hyperparameters: ``RERANK_HARD_NEGATIVES`` unless the job sets
        ``hard_negatives``; set to 0, the pairs must bring negatives of their own (a
        400 naming ``training_file`` if none does)."""
        said = isinstance(raw, dict) and raw.get("hard_negatives", "auto") != "auto"
        if not said:
            return replace(hp, hard_negatives=RERANK_HARD_NEGATIVES)
        if hp.hard_negatives == 0:
            pairs = await self.store.pairs(tenant, training)
            if not any(p.negatives for p in pairs):
                raise InvalidInput(
                    "a reranker learns to rank a query's candidates, and no pair in "
                    f"training_file {training!r} brings any (its negatives) while "
                    "hyperparameters.hard_negatives is 0, so none are mined: add "
                    "negatives to the pairs, or leave hard_negatives to its default",
                    field="training_file",
                )
        return hp

    async def jobs(self, principal: Principal) -> list[Job]:
        """The caller's jobs; an admin key's: every tenant's."""
        return await self.store.jobs(None if _admin(principal) else principal.tenant)

    async def job(self, principal: Principal, job_id: str) -> Job:
        return await self.store.job(await self._tenant_of(principal, "jobs", job_id), job_id)

    async def _tenant_of(self, principal: Principal, kind: str, ident: str) -> str:
        """Where to look for ``ident``: the caller's tenant, or for an admin key the
        tenant that holds it (a 404 names the caller's tenant when none does)."""
        if _admin(principal):
            return await self.store.owner_of(kind, ident) or principal.tenant
        return principal.tenant

    async def events(
        self, principal: Principal, job_id: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[dict[str, object]], bool]:
        """Newest first, as OpenAI's feed: the ``limit`` events older than ``after`` (an
        event id from an earlier page), and whether there are more."""
        job = await self.job(principal, job_id)
        rows = [e.to_dict(job.id) for e in reversed(await self.store.events(job.tenant, job.id))]
        if after is not None:
            ids = [r["id"] for r in rows]
            if after not in ids:
                raise InvalidInput(f"after {after!r} is not an event of {job.id}", field="after")
            rows = rows[ids.index(after) + 1 :]
        return rows[:limit], len(rows) > limit

    async def cancel(self, principal: Principal, job_id: str) -> Job:
        """409 for a finished job. A queued one is cancelled here; a running one is asked
        to stop, and this waits a little for its trainer to say it has."""
        _can_write(principal)
        job = await self.job(principal, job_id)
        if job.status.finished:
            raise Conflict(f"job {job.id} has {job.status.value} already", field="job")
        await self.store.request_cancel(job.tenant, job.id)
        if job.status in (JobStatus.VALIDATING_FILES, JobStatus.QUEUED):
            job = job.with_(status=JobStatus.CANCELLED, finished_at=int(time.time()))
            await add_event(self.store, job, "cancelled before training began", type="status")
            await self.store.put_job(job)  # (after its event, as the runner's _finish)
            return job
        deadline = time.monotonic() + CANCEL_WAIT
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            job = await self.store.job(job.tenant, job.id)
            if job.status.finished:
                break
        return job


def _admin(principal: Principal) -> bool:
    """An admin key sees every tenant's files and jobs, as it sees every adapter."""
    return Scope.ADMIN in principal.scopes


def _can_write(principal: Principal) -> None:
    if not principal.can(Scope.ADAPTERS_WRITE):
        raise Forbidden("fine-tuning needs a key with the adapters:write scope", field="scope")


def _check_task(task: object, model: str, family: str) -> None:
    """A 400 naming ``model`` when its family trains no task, or not the ``task``
    asked for (``embed``: a dense base; ``rerank``: a cross-encoder; absent: either)."""
    if task is not None and task not in TASKS:
        raise InvalidInput(f"task must be one of {', '.join(TASKS)}, not {task!r}", field="task")
    if family not in TRAINABLE or (task is not None and TASKS[str(task)] != family):
        wants = (
            f"a {str(task)!r} job trains a {TASKS[str(task)]} base"
            if task is not None
            else "fine-tuning jobs train " + " and ".join(
                f"{f} bases ({t})" for t, f in TASKS.items())
        )  # fmt: skip
        raise InvalidInput(f"model {model!r} is of the {family} family: {wants}", field="model")


def _file_id(value: object, name: str, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"field {name} (a file id from POST /v1/files) is required", field=name)
    return value


def _fraction(value: object, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.01 <= value <= 0.5:
        raise InvalidInput(
            f"validation_fraction must be between 0.01 and 0.5, not {value!r}",
            field="validation_fraction",
        )
    return float(value)


def _margin(value: object, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not -1 <= value <= 1:
        raise InvalidInput(f"margin must be between -1 and 1, not {value!r}", field="margin")
    return float(value)
