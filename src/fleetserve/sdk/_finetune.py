"""The SDK's fine-tuning calls (``/v1/files``, ``/v1/fine_tuning/jobs``), as two mixins
that :class:`~fleetserve.Client` and :class:`~fleetserve.AsyncClient` take, with the
same names and arguments (the async ones are coroutines).

- ``upload_file(file, filename=None)``: a JSONL of ``{query, positive, negative?}``
  rows (a path, the bytes, or a list of row dicts); the server checks it whole.
- ``list_files()``, ``get_file(id)``.
- ``create_fine_tuning_job(model, training_file, ...)``, ``get_fine_tuning_job(id)``,
  ``list_fine_tuning_jobs()`` (newest first), ``fine_tuning_events(id, after=None,
  limit=20)`` (newest first, as OpenAI's feed), ``cancel_fine_tuning_job(id)``.
- ``wait_fine_tuning_job(id, poll=0.5, timeout=None, on_event=None)``: polls until
  the job ends and returns it, backing off to 5 s between polls while no event comes;
  ``on_event(event)`` sees each new event once, oldest first.
- ``fine_tune(model, pairs, eval=None, ...)``: upload, create and (``wait=True``) wait;
  a job that ends failed or cancelled raises ``FineTuningFailed`` (its record in ``job``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from ..wire import Encoding
from ..wire.codec import dumps
from ..wire.finetune import PURPOSE, JobStatus
from ._adapters import Request
from ._job_wait import Backoff, Follower, OnEvent, check, deadline_of, succeeded, until
from .records import FileObject, FineTuningEvent, FineTuningJob, file_list, file_object, job

T = TypeVar("T")
R = TypeVar("R")
Pairs = str | Path | bytes | Sequence[Mapping[str, object]]
Page = tuple[list[R], bool]  # one page of a listing, and whether more follow
FILES = "/v1/files"
JOBS = "/v1/fine_tuning/jobs"
PAGE = 100  # events and jobs read per request while following or listing
GRACE_POLLS = 10  # polls (0.1 s apart) for a finished job's last event to appear


def _read(file: Pairs, filename: str | None) -> tuple[bytes, str]:
    if isinstance(file, bytes):
        return file, filename or "pairs.jsonl"
    if isinstance(file, str | Path):
        path = Path(file).expanduser()
        return path.read_bytes(), filename or path.name
    rows = b"".join(json.dumps(dict(r), ensure_ascii=False).encode() + b"\n" for r in file)
    return rows, filename or "pairs.jsonl"


def upload(file: Pairs, filename: str | None, truncate: bool = False) -> Request[FileObject]:
    data, name = _read(file, filename)
    params = {"filename": name, "purpose": PURPOSE}
    if truncate:  # texts over the server's train_max_chars are cut, not a 400
        params["truncate"] = "true"
    return Request(
        "POST", FILES, file_object, params=params, content=data, content_type="application/jsonl"
    )


def _page(r: Any) -> Page[Any]:
    return list(r["data"]), bool(r.get("has_more"))


def _id(ident: str) -> str:
    return quote(ident, safe="")


def job_body(model: str, training_file: str, **fields: object) -> dict[str, object]:
    """The job's fields, without those left unset (the server's defaults apply)."""
    body: dict[str, object] = {"model": model, "training_file": training_file}
    return body | {k: v for k, v in fields.items() if v is not None}


def create(body: dict[str, object]) -> Request[FineTuningJob]:
    return Request("POST", JOBS, job, content=dumps(body, Encoding.MSGPACK))


def events_page(job_id: str, after: str | None, limit: int) -> Request[Page[FineTuningEvent]]:
    params = {"limit": str(limit)} | ({"after": after} if after else {})
    return Request("GET", f"{JOBS}/{_id(job_id)}/events", _page, params=params)


def jobs_page(after: str | None) -> Request[Page[FineTuningJob]]:
    params = {"limit": str(PAGE)} | ({"after": after} if after else {})
    return Request("GET", JOBS, _page, params=params)


def finished(record: FineTuningJob) -> bool:
    return JobStatus(record["status"]).finished


class FineTuneMethods:
    """``Client``'s fine-tuning calls (see the module docstring)."""

    def _send(self, req: Request[T], timeout: float | None) -> T:
        raise NotImplementedError

    def upload_file(
        self,
        file: Pairs,
        *,
        filename: str | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> FileObject:
        """Upload a JSONL of pairs; the file (``id``, ``rows``, ``warnings``...). A text
        over the server's ``train_max_chars`` is a 400, or with ``truncate`` cut to it."""
        return self._send(upload(file, filename, truncate), timeout)

    def list_files(self, *, timeout: float | None = None) -> list[FileObject]:
        return self._send(Request("GET", FILES, file_list), timeout)

    def get_file(self, file_id: str, *, timeout: float | None = None) -> FileObject:
        return self._send(Request("GET", f"{FILES}/{_id(file_id)}", file_object), timeout)

    def create_fine_tuning_job(
        self,
        model: str,
        training_file: str,
        *,
        validation_file: str | None = None,
        hyperparameters: Mapping[str, object] | None = None,
        suffix: str | None = None,
        validation_fraction: float | None = None,
        margin: float | None = None,
        seed: int | None = None,
        task: str | None = None,
        timeout: float | None = None,
    ) -> FineTuningJob:
        """Queue a job training a LoRA of ``model`` on a file's pairs; the job.
        ``task``: ``embed`` (a dense base) or ``rerank`` (a cross-encoder); unset, the
        base's family decides."""
        body = job_body(
            model, training_file, validation_file=validation_file,
            hyperparameters=hyperparameters, suffix=suffix,
            validation_fraction=validation_fraction, margin=margin, seed=seed, task=task,
        )  # fmt: skip
        return self._send(create(body), timeout)

    def get_fine_tuning_job(self, job_id: str, *, timeout: float | None = None) -> FineTuningJob:
        return self._send(Request("GET", f"{JOBS}/{_id(job_id)}", job), timeout)

    def list_fine_tuning_jobs(self, *, timeout: float | None = None) -> list[FineTuningJob]:
        """Every job of this key's tenant, newest first."""
        out: list[FineTuningJob] = []
        after = None
        while True:
            rows, more = self._send(jobs_page(after), timeout)
            out.extend(rows)
            if not more or not rows:
                return out
            after = rows[-1]["id"]

    def fine_tuning_events(
        self,
        job_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        timeout: float | None = None,
    ) -> list[FineTuningEvent]:
        """One page of the job's events, newest first (``after``: an event id)."""
        return self._send(events_page(job_id, after, limit), timeout)[0]

    def cancel_fine_tuning_job(self, job_id: str, *, timeout: float | None = None) -> FineTuningJob:
        return self._send(Request("POST", f"{JOBS}/{_id(job_id)}/cancel", job), timeout)

    def wait_fine_tuning_job(
        self,
        job_id: str,
        *,
        poll: float = 0.5,
        timeout: float | None = None,
        on_event: OnEvent | None = None,
        raise_on_failure: bool = False,
    ) -> FineTuningJob:
        """Poll until the job ends (``DeadlineExceeded`` after ``timeout`` s); the job
        (``raise_on_failure``: ``FineTuningFailed`` unless it succeeded). Polls come
        ``poll`` s apart while events arrive, further apart (up to 5 s) while none do."""
        follow, deadline, grace = Follower(on_event), deadline_of(timeout), 0
        wait = Backoff(poll)
        while True:
            job = self.get_fine_tuning_job(job_id)
            after: str | None = None
            while after := follow.take(self._send(events_page(job_id, after, PAGE), None)):
                pass
            follow.flush()
            if finished(job):
                if follow.ended(job) or grace >= GRACE_POLLS:
                    return succeeded(job) if raise_on_failure else job
                grace += 1
                time.sleep(min(poll, 0.1))
                continue
            check(deadline, job_id, timeout)
            time.sleep(until(deadline, wait.next(follow.progressed)))

    def fine_tune(
        self,
        model: str,
        pairs: Pairs,
        *,
        eval: Pairs | None = None,
        suffix: str | None = None,
        hyperparameters: Mapping[str, object] | None = None,
        wait: bool = True,
        on_event: OnEvent | None = None,
        **job_kwargs: Any,
    ) -> FineTuningJob:
        """Upload ``pairs`` (and ``eval``), create the job, and wait for it (``wait``)."""
        training = self.upload_file(pairs)["id"]
        validation = None if eval is None else self.upload_file(eval)["id"]
        job = self.create_fine_tuning_job(
            model, training, validation_file=validation, hyperparameters=hyperparameters,
            suffix=suffix, **job_kwargs,
        )  # fmt: skip
        if not wait:
            return job
        return self.wait_fine_tuning_job(job["id"], on_event=on_event, raise_on_failure=True)


class AsyncFineTuneMethods:
    """``AsyncClient``'s fine-tuning calls: ``Client``'s, as coroutines. An
    ``on_event`` that returns an awaitable is awaited."""

    async def _send(self, req: Request[T], timeout: float | None) -> T:
        raise NotImplementedError

    async def upload_file(
        self,
        file: Pairs,
        *,
        filename: str | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> FileObject:
        return await self._send(upload(file, filename, truncate), timeout)

    async def list_files(self, *, timeout: float | None = None) -> list[FileObject]:
        return await self._send(Request("GET", FILES, file_list), timeout)

    async def get_file(self, file_id: str, *, timeout: float | None = None) -> FileObject:
        return await self._send(Request("GET", f"{FILES}/{_id(file_id)}", file_object), timeout)

    async def create_fine_tuning_job(
        self,
        model: str,
        training_file: str,
        *,
        validation_file: str | None = None,
        hyperparameters: Mapping[str, object] | None = None,
        suffix: str | None = None,
        validation_fraction: float | None = None,
        margin: float | None = None,
        seed: int | None = None,
        task: str | None = None,
        timeout: float | None = None,
    ) -> FineTuningJob:
        body = job_body(
            model, training_file, validation_file=validation_file,
            hyperparameters=hyperparameters, suffix=suffix,
            validation_fraction=validation_fraction, margin=margin, seed=seed, task=task,
        )  # fmt: skip
        return await self._send(create(body), timeout)

    async def get_fine_tuning_job(
        self, job_id: str, *, timeout: float | None = None
    ) -> FineTuningJob:
        return await self._send(Request("GET", f"{JOBS}/{_id(job_id)}", job), timeout)

    async def list_fine_tuning_jobs(self, *, timeout: float | None = None) -> list[FineTuningJob]:
        out: list[FineTuningJob] = []
        after = None
        while True:
            rows, more = await self._send(jobs_page(after), timeout)
            out.extend(rows)
            if not more or not rows:
                return out
            after = rows[-1]["id"]

    async def fine_tuning_events(
        self,
        job_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        timeout: float | None = None,
    ) -> list[FineTuningEvent]:
        return (await self._send(events_page(job_id, after, limit), timeout))[0]

    async def cancel_fine_tuning_job(
        self, job_id: str, *, timeout: float | None = None
    ) -> FineTuningJob:
        return await self._send(Request("POST", f"{JOBS}/{_id(job_id)}/cancel", job), timeout)

    async def wait_fine_tuning_job(
        self,
        job_id: str,
        *,
        poll: float = 0.5,
        timeout: float | None = None,
        on_event: OnEvent | None = None,
        raise_on_failure: bool = False,
    ) -> FineTuningJob:
        follow, deadline, grace = Follower(on_event), deadline_of(timeout), 0
        wait = Backoff(poll)
        while True:
            job = await self.get_fine_tuning_job(job_id)
            after: str | None = None
            while after := follow.take(await self._send(events_page(job_id, after, PAGE), None)):
                pass
            for out in follow.flush():
                if inspect.isawaitable(out):
                    await out
            if finished(job):
                if follow.ended(job) or grace >= GRACE_POLLS:
                    return succeeded(job) if raise_on_failure else job
                grace += 1
                await asyncio.sleep(min(poll, 0.1))
                continue
            check(deadline, job_id, timeout)
            await asyncio.sleep(until(deadline, wait.next(follow.progressed)))

    async def fine_tune(
        self,
        model: str,
        pairs: Pairs,
        *,
        eval: Pairs | None = None,
        suffix: str | None = None,
        hyperparameters: Mapping[str, object] | None = None,
        wait: bool = True,
        on_event: OnEvent | None = None,
        **job_kwargs: Any,
    ) -> FineTuningJob:
        training = (await self.upload_file(pairs))["id"]
        validation = None if eval is None else (await self.upload_file(eval))["id"]
        job = await self.create_fine_tuning_job(
            model, training, validation_file=validation, hyperparameters=hyperparameters,
            suffix=suffix, **job_kwargs,
        )  # fmt: skip
        if not wait:
            return job
        return await self.wait_fine_tuning_job(job["id"], on_event=on_event, raise_on_failure=True)
