"""What the fine-tuning API tests share: a FineTuning over memory (no trainer: jobs stay
queued unless a test moves them through the store), a real Gateway in front of it
with three keys, and that gateway served by uvicorn on port 0 in a thread."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetserve.catalog import Catalog
from fleetserve.gateway import Gateway
from fleetserve.gateway.auth import Authenticator, KeyEntry, hash_key
from fleetserve.gateway.finetune import FineTuneRoutes
from fleetserve.gateway.wiring import Hooks, Routes
from fleetserve.lifecycle import shutdown, start_http
from fleetserve.lora.jobs.manager import FineTuning, TrainLimits, add_event
from fleetserve.lora.jobs.queue import MemoryJobQueue
from fleetserve.lora.jobs.store import JobStore
from fleetserve.lora.store import AdapterStore
from fleetserve.metrics import Metrics
from fleetserve.settings import Settings
from fleetserve.storage import MemoryStore
from fleetserve.wire import Scope
from fleetserve.wire.finetune import Job, JobStatus

FAMILIES = {"tiny/dense": "dense", "tiny/rerank": "cross_encoder"}
DENSE = "tiny/dense"
MAX_FILE_BYTES = 4096
TOTAL_STEPS = 4
ALICE = "fs-alice-key-for-finetune-tests"  # tenant alice, infer + adapters:write
BOB = "fs-bob-key-for-finetune-tests"  # tenant bob, the same scopes
READER = "fs-reader-key-for-finetune-tests"  # tenant alice, infer only
ADMIN = "fs-admin-key-for-finetune-tests"  # tenant ops, admin
_RW = frozenset({Scope.INFER, Scope.ADAPTERS_WRITE})
ENTRIES = [
    KeyEntry(hash_key(ALICE), "alice", _RW),
    KeyEntry(hash_key(BOB), "bob", _RW),
    KeyEntry(hash_key(READER), "alice", frozenset({Scope.INFER})),
    KeyEntry(hash_key(ADMIN), "ops", frozenset({Scope.ADMIN})),
]


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def pairs(n: int = 6, queries: int = 3) -> bytes:
    rows = ({"query": f"question {i % queries}", "positive": f"answer {i}"} for i in range(n))
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def finetuning() -> FineTuning:
    store = JobStore(AdapterStore(MemoryStore()))
    return FineTuning(store, MemoryJobQueue(), FAMILIES.get, TrainLimits(min_pairs=3))


def gateway(ft: FineTuning, tune_dir: Path) -> Gateway:
    return Gateway(
        Settings.load(overrides={"tune_dir": str(tune_dir)}),
        Catalog(),
        None,  # type: ignore[arg-type]  # no inference here
        Metrics(),
        hooks=Hooks(ready=lambda: True),
        routes=Routes(finetune=FineTuneRoutes(ft, max_file_bytes=MAX_FILE_BYTES)),
        authenticator=Authenticator.from_entries(ENTRIES),
    )


async def run_steps(store: JobStore, job: Job, steps: int, *, first: int = 1) -> Job:
    """A trainer's writes while it trains: running, then progress events."""
    job = job.with_(status=JobStatus.RUNNING, started_at=job.started_at or int(time.time()))
    await store.put_job(job)
    if first == 1:
        await add_event(store, job, "training started", type="status")
    for step in range(first, first + steps):
        data = {"step": step, "total_steps": TOTAL_STEPS, "epoch": 1, "train_loss": 1 / step}
        await add_event(store, job, f"step {step}/{TOTAL_STEPS}", type="metrics", data=data)
    return job


async def finish(store: JobStore, job: Job, status: JobStatus, **fields: Any) -> Job:
    """A trainer's last writes: the record in its end state, then its status line."""
    job = job.with_(status=status, finished_at=int(time.time()), **fields)
    await store.put_job(job)
    level = "error" if status is JobStatus.FAILED else "info"
    await add_event(store, job, f"job {status.value}", level=level, type="status")
    return job


RESULT = {
    "base": {"ndcg_at_10": 0.5, "recall_at_10": 0.6},
    "adapter": {"ndcg_at_10": 0.75, "recall_at_10": 0.8},
    "gain": 0.25, "margin": 0.01, "registered": True, "adapter_id": "alice/legal@1",
    "train_seconds": 12.5,
}  # fmt: skip


class Served:
    """The gateway under uvicorn on 127.0.0.1:0, on a loop in a thread of its own."""

    def __init__(self, tune_dir: Path) -> None:
        self.ft = finetuning()
        self.app = gateway(self.ft, tune_dir)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),))

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        http, task, self.port = await start_http(self.app, "127.0.0.1", 0)
        self._ready.set()
        await self._stop.wait()
        await shutdown(http, [task])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def store(self) -> JobStore:
        return self.ft.store

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run the coroutine ``fn()`` on the server's loop; its result."""
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(10)

    def start(self) -> Served:
        self._thread.start()
        assert self._ready.wait(10), "the server did not start"
        return self

    def stop(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(name="served")
def served_fixture(tmp_path: Path) -> Iterator[Served]:
    srv = Served(tmp_path / "tune").start()
    yield srv
    srv.stop()
