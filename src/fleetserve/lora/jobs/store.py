"""Where files and jobs live between the gateway that takes them and the worker that
trains: the adapter store (memory, a directory, S3 or the NATS object store), under
``finetune/``. Keys carry the tenant, so one tenant never reads another's.

- ``finetune/files/<tenant>/<id>.json``: the file's record; ``.jsonl``: its pairs,
  checked and deduplicated.
- ``finetune/jobs/<tenant>/<id>.json``: the job's record, written by whoever holds
  the job (the gateway until it is queued, then the worker that trains it).
- ``.../<id>.events``: its feed (JSON lines, rewritten whole; a few hundred lines at
  most); ``.../<id>.cancel``: the cancel request; ``.../<id>.ckpt``: the last
  checkpoint, which a redelivered job resumes from.
- ``.../<id>.lease`` and ``.../<id>.claim-<epoch>``: which embedded server holds the
  job, and how it changed hands (``leases.py``); gone once the job is settled.
"""

from __future__ import annotations

import asyncio
import json
import re
from contextlib import suppress
from pathlib import Path
from typing import Any

from ...wire import NotFound
from ...wire.finetune import FileInfo, Job, JobEvent, Pair
from ..pairs import read_pairs
from ..store import AdapterStore, PayloadMissing

ROOT = "finetune"
ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
TWO_QUERIES = "two_queries"  # in a file's record, not its API answer
MAX_EVENTS = 1000  # a feed keeps its first status lines and the newest progress


class JobStore:
    def __init__(self, store: AdapterStore) -> None:
        self.store = store

    # -- files ----------------------------------------------------------------------------
    async def put_file(
        self, info: FileInfo, pairs: bytes | Path, *, two_queries: bool | None = None
    ) -> None:
        """Keep a file's pairs (bytes, or a file on disk: moved into a file store or
        streamed into an object store, never read whole here) and then its record;
        ``two_queries``: whether the pairs ask two or more queries (kept in the record,
        so a job's check of a held-out split needs not read the pairs)."""
        base = f"{ROOT}/files/{info.tenant}/{info.id}"
        if isinstance(pairs, Path):
            await self.store.put_file(base + ".jsonl", pairs)
        else:
            await self.store.put(base + ".jsonl", pairs)
        record = info.to_dict() | ({} if two_queries is None else {TWO_QUERIES: two_queries})
        await self.store.put(base + ".json", _dump(record))  # last: the commit

    async def file(self, tenant: str, file_id: str) -> FileInfo:
        raw = await self._get(f"{ROOT}/files/{tenant}/{_safe(file_id)}.json")
        if raw is None:
            raise NotFound(f"no file {file_id!r} for tenant {tenant}", field="file")
        return FileInfo.from_dict(json.loads(raw))

    async def two_queries(self, tenant: str, file_id: str) -> bool | None:
        """Whether the file's pairs ask two or more queries; None for a file whose record
        does not say (kept before records said it)."""
        raw = await self._get(f"{ROOT}/files/{tenant}/{_safe(file_id)}.json")
        if raw is None:
            raise NotFound(f"no file {file_id!r} for tenant {tenant}", field="file")
        said = json.loads(raw).get(TWO_QUERIES)
        return None if said is None else bool(said)

    async def pairs(self, tenant: str, file_id: str) -> tuple[Pair, ...]:
        raw = await self._get(f"{ROOT}/files/{tenant}/{_safe(file_id)}.jsonl")
        if raw is None:
            raise NotFound(f"no file {file_id!r} for tenant {tenant}", field="file")
        return await asyncio.to_thread(read_pairs, raw)

    async def files(self, tenant: str | None) -> list[FileInfo]:
        """``tenant``'s files; every tenant's for ``None`` (an admin's view)."""
        prefix = f"{ROOT}/files/{tenant}/" if tenant is not None else f"{ROOT}/files/"
        out = []
        for key in await self.store.keys(prefix):
            if key.endswith(".json") and (raw := await self._get(key)) is not None:
                out.append(FileInfo.from_dict(json.loads(raw)))
        return sorted(out, key=lambda f: (f.created_at, f.id))

    # -- jobs -----------------------------------------------------------------------------
    def _job_key(self, tenant: str, job_id: str, ext: str) -> str:
        return f"{ROOT}/jobs/{tenant}/{_safe(job_id)}.{ext}"

    async def put_job(self, job: Job) -> None:
        await self.store.put(self._job_key(job.tenant, job.id, "json"), _dump(job.to_dict()))

    async def job(self, tenant: str, job_id: str) -> Job:
        raw = await self._get(self._job_key(tenant, job_id, "json"))
        if raw is None:
            raise NotFound(f"no fine-tuning job {job_id!r} for tenant {tenant}", field="job")
        return Job.from_dict(json.loads(raw))

    async def jobs(self, tenant: str | None) -> list[Job]:
        """``tenant``'s jobs; every tenant's for ``None`` (an admin's view)."""
        prefix = f"{ROOT}/jobs/{tenant}/" if tenant is not None else f"{ROOT}/jobs/"
        out = []
        for key in await self.store.keys(prefix):
            if key.endswith(".json") and (raw := await self._get(key)) is not None:
                out.append(Job.from_dict(json.loads(raw)))
        return sorted(out, key=lambda j: (j.created_at, j.id))

    async def owner_of(self, kind: str, ident: str) -> str | None:
        """The tenant that holds file or job ``ident`` (``kind``: "files" or "jobs")."""
        tail = f"/{_safe(ident)}.json"
        for key in await self.store.keys(f"{ROOT}/{kind}/"):
            if key.endswith(tail) and key.count("/") == 3:
                return key.split("/")[2]
        return None

    async def tenants_with_jobs(self) -> list[str]:
        keys = await self.store.keys(f"{ROOT}/jobs/")
        return sorted({k.split("/")[2] for k in keys if k.count("/") >= 3})

    async def events(self, tenant: str, job_id: str) -> list[JobEvent]:
        raw = await self._get(self._job_key(tenant, job_id, "events"))
        if raw is None:
            return []
        return [_event(json.loads(line)) for line in raw.splitlines() if line.strip()]

    async def put_events(self, tenant: str, job_id: str, events: list[JobEvent]) -> None:
        if len(events) > MAX_EVENTS:  # keep the first lines (how it began) and the newest
            events = events[:100] + events[-(MAX_EVENTS - 100) :]
        lines = b"".join(_dump(_event_dict(e)) + b"\n" for e in events)
        await self.store.put(self._job_key(tenant, job_id, "events"), lines)

    async def request_cancel(self, tenant: str, job_id: str) -> None:
        await self.store.put(self._job_key(tenant, job_id, "cancel"), b"1")

    async def cancel_requested(self, tenant: str, job_id: str) -> bool:
        return await self._get(self._job_key(tenant, job_id, "cancel")) is not None

    async def put_checkpoint(self, tenant: str, job_id: str, blob: bytes) -> None:
        await self.store.put(self._job_key(tenant, job_id, "ckpt"), blob)

    async def checkpoint(self, tenant: str, job_id: str) -> bytes | None:
        return await self._get(self._job_key(tenant, job_id, "ckpt"))

    async def drop_leftovers(self, tenant: str, job_id: str) -> None:
        """A finished job's checkpoint and cancel flag: no longer needed."""
        for ext in ("ckpt", "cancel"):
            with suppress(PayloadMissing, FileNotFoundError):
                await self.store.delete(self._job_key(tenant, job_id, ext))

    # -- leases (embedded servers sharing a store: leases.py) --------------------------------
    async def lease(self, tenant: str, job_id: str) -> dict[str, Any] | None:
        raw = await self._get(self._job_key(tenant, job_id, "lease"))
        return None if raw is None else dict(json.loads(raw))

    async def put_lease(self, tenant: str, job_id: str, record: dict[str, object]) -> None:
        await self.store.put(self._job_key(tenant, job_id, "lease"), _dump(record))

    async def claim_lease(
        self, tenant: str, job_id: str, epoch: int, record: dict[str, Any]
    ) -> bool:
        """Create ``<id>.claim-<epoch>`` unless it exists: of two claimants, one wins."""
        return await self.store.create(
            self._job_key(tenant, job_id, f"claim-{epoch}"), _dump(record)
        )

    async def claim(self, tenant: str, job_id: str, epoch: int) -> dict[str, object] | None:
        raw = await self._get(self._job_key(tenant, job_id, f"claim-{epoch}"))
        return None if raw is None else dict(json.loads(raw))

    async def drop_lease(self, tenant: str, job_id: str, epochs: range) -> None:
        """The lease and its claims: the job is settled, nobody holds it."""
        for ext in ("lease", *(f"claim-{e}" for e in epochs)):
            with suppress(PayloadMissing, FileNotFoundError):
                await self.store.delete(self._job_key(tenant, job_id, ext))

    async def leased(self) -> list[tuple[str, str]]:
        """(tenant, job id) of every job with a lease record."""
        out = []
        for key in await self.store.keys(f"{ROOT}/jobs/"):
            parts = key.split("/")
            if len(parts) == 4 and parts[3].endswith(".lease"):
                out.append((parts[2], parts[3].removesuffix(".lease")))
        return out

    async def _get(self, key: str) -> bytes | None:
        try:
            return await self.store.get(key)
        except PayloadMissing:
            return None


def _safe(ident: str) -> str:
    """An id from a URL: never a path, nothing but what ids are made of (``prefix-hex``)."""
    if not ID_RE.fullmatch(ident):
        raise NotFound(f"no such id {ident[:80]!r}", field="id")
    return ident


def _dump(d: dict[str, object]) -> bytes:
    return json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode()


def _event_dict(e: JobEvent) -> dict[str, object]:
    return {"seq": e.seq, "t": e.created_at, "m": e.message, "l": e.level, "k": e.type,
            "d": e.data}  # fmt: skip


def _event(d: dict[str, Any]) -> JobEvent:
    return JobEvent(int(d["seq"]), float(d["t"]), d["m"], d["l"], d["k"], d.get("d"))
