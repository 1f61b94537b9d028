"""The SDK's fine-tuning calls, sync against a served gateway and async through ASGI:
uploads of each kind, jobs, pages, typed errors, and waiting on a job that the test
moves through the store as a trainer would (each event seen once, oldest first)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

import fleetserve
import fleetserve.sdk._finetune as f
from fleetserve import AsyncClient, Client
from fleetserve.wire import Conflict, DeadlineExceeded, Forbidden, InvalidInput, NotFound
from fleetserve.wire.finetune import JobStatus

from ..gateway.finetune_kit import (
    ALICE,
    DENSE,
    READER,
    RESULT,
    Served,
    finetuning,
    finish,
    gateway,
    pairs,
    run_steps,
    served_fixture,  # noqa: F401
)


def test_files_and_jobs(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(pairs(6))
    with Client(served.url, api_key=ALICE) as c:
        a = c.upload_file(path)
        assert (a["filename"], a["rows"]) == ("train.jsonl", 6)
        b = c.upload_file(pairs(4), filename="b.jsonl")
        rows = [{"query": "q1", "positive": "p1"}, {"query": "q2", "positive": "p2"}]
        c_ = c.upload_file([*rows, {"query": "q3", "positive": "p3", "negative": ["n"]}])
        assert (b["filename"], c_["filename"], c_["rows"]) == ("b.jsonl", "pairs.jsonl", 3)
        assert {x["id"] for x in c.list_files()} == {a["id"], b["id"], c_["id"]}
        assert c.get_file(a["id"]) == a
        with pytest.raises(InvalidInput, match="line 2") as bad:
            c.upload_file(b'{"query": "q", "positive": "p"}\n[1]\n')
        assert bad.value.field == "line 2"
        with pytest.raises(NotFound):
            c.get_file("file-nope")
        job = c.create_fine_tuning_job(
            DENSE, a["id"], validation_file=b["id"], hyperparameters={"rank": 4},
            suffix="legal", margin=0.05, seed=3,
        )  # fmt: skip
        assert job["status"] == "queued" and job["validation_file"] == b["id"]
        assert (job["margin"], job["seed"], job["hyperparameters"]["rank"]) == (0.05, 3, 4)
        assert c.get_fine_tuning_job(job["id"]) == job
        with pytest.raises(InvalidInput, match=r"hyperparameters\.epochs"):
            c.create_fine_tuning_job(DENSE, a["id"], hyperparameters={"epochs": 0})
        with pytest.raises(InvalidInput, match="validation_fraction"):
            c.create_fine_tuning_job(DENSE, a["id"], validation_fraction=2.0)
        others = [c.create_fine_tuning_job(DENSE, a["id"])["id"] for _ in range(2)]
        monkeypatch.setattr(f, "PAGE", 2)  # three jobs: two pages
        assert {j["id"] for j in c.list_fine_tuning_jobs()} == {job["id"], *others}
        events = c.fine_tuning_events(job["id"], limit=1)
        assert [e["message"] for e in events] == ["files validated; job queued"]
        older = c.fine_tuning_events(job["id"], after=events[0]["id"])
        assert older[0]["message"].startswith("created fine-tuning job")
        assert c.cancel_fine_tuning_job(job["id"])["status"] == "cancelled"
        with pytest.raises(Conflict):
            c.cancel_fine_tuning_job(job["id"])
        with pytest.raises(DeadlineExceeded, match="did not finish"):
            c.wait_fine_tuning_job(others[0], poll=0.01, timeout=0.05)
    with Client(served.url, api_key=READER) as c, pytest.raises(Forbidden):
        c.upload_file(pairs())


def test_wait_sees_each_event_once_oldest_first(served: Served) -> None:
    seen: list[dict[str, Any]] = []
    stepped = threading.Event()
    failed: list[BaseException] = []

    def on_event(event: dict[str, Any]) -> None:
        seen.append(event)
        if event["message"] == "step 2/4":
            stepped.set()

    def trainer(job_id: str) -> None:
        try:
            job = served.call(lambda: served.store.job("alice", job_id))
            job = served.call(lambda: run_steps(served.store, job, 2))
            assert stepped.wait(10)  # the follower has read the first half
            job = served.call(lambda: run_steps(served.store, job, 2, first=3))
            model = f"{DENSE}:alice/legal@1"
            served.call(lambda: finish(served.store, job, JobStatus.SUCCEEDED, result=RESULT,
                                       fine_tuned_model=model))  # fmt: skip
        except BaseException as exc:
            failed.append(exc)

    with Client(served.url, api_key=ALICE) as c:
        queued = c.fine_tune(DENSE, pairs(), suffix="legal", wait=False)
        assert queued["status"] == "queued"
        thread = threading.Thread(target=trainer, args=(queued["id"],))
        thread.start()
        done = c.wait_fine_tuning_job(queued["id"], poll=0.01, timeout=20, on_event=on_event)
        thread.join()
    assert not failed
    assert done["status"] == "succeeded" and done["fine_tuned_model"] == f"{DENSE}:alice/legal@1"
    said = [e["message"] for e in seen]
    assert said == [
        f"created fine-tuning job {queued['id']}", "files validated; job queued",
        "training started", "step 1/4", "step 2/4", "step 3/4", "step 4/4", "job succeeded",
    ]  # fmt: skip
    assert seen[3]["data"] == {"step": 1, "total_steps": 4, "epoch": 1, "train_loss": 1.0}


def test_wait_reads_the_last_line_written_after_the_record() -> None:
    """A trainer writes the finished record, then its last event: a wait that sees the
    record first still hands on that event."""
    job: dict[str, Any] = {"id": "ftjob-1", "status": "succeeded", "finished_at": 100}
    events = [{"id": "ftevent-1-1", "type": "status", "created_at": 90, "message": "queued"}]
    reads = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal reads
        if request.url.path.endswith("/events"):
            reads += 1
            if reads == 2:  # the writer's last line lands between two reads
                events.insert(0, {"id": "ftevent-1-2", "type": "status", "created_at": 100,
                                  "message": "job succeeded"})  # fmt: skip
            body: Any = {"object": "list", "data": events, "has_more": False}
        else:
            body = job
        return httpx.Response(200, content=msgspec.msgpack.encode(body))

    seen: list[str] = []
    with Client("http://t", transport=httpx.MockTransport(handle)) as c:
        assert c.wait_fine_tuning_job("ftjob-1", poll=0.01, on_event=lambda e: seen.append(
            e["message"]))["status"] == "succeeded"  # fmt: skip
    assert seen == ["queued", "job succeeded"] and reads == 2


async def test_the_async_client(tmp_path: Path) -> None:
    ft = finetuning()
    transport = httpx.ASGITransport(app=gateway(ft, tmp_path / "tune"))
    seen: list[str] = []
    queued = asyncio.Event()

    async def on_event(event: dict[str, Any]) -> None:
        seen.append(event["message"])
        queued.set()

    async def trainer() -> None:
        await queued.wait()
        [job] = await ft.store.jobs("alice")
        job = await run_steps(ft.store, job, 1)
        await finish(ft.store, job, JobStatus.FAILED, error={"message": "out of memory"})

    async with AsyncClient("http://t", transport=transport, api_key=ALICE) as c:
        task = asyncio.ensure_future(trainer())
        with pytest.raises(fleetserve.FineTuningFailed) as info:
            await c.fine_tune(DENSE, pairs(), eval=pairs(3), on_event=on_event, seed=1)
        await task
        done = info.value.job
        assert done["status"] == "failed" and done["error"]["message"] == "out of memory"
        assert done["validation_file"] is not None and done["seed"] == 1
        assert seen[-3:] == ["training started", "step 1/4", "job failed"]
        assert [j["id"] for j in await c.list_fine_tuning_jobs()] == [done["id"]]
        assert len(await c.list_files()) == 2
        assert (await c.get_file(done["training_file"]))["rows"] == 6
        assert (await c.get_fine_tuning_job(done["id"]))["status"] == "failed"
        assert len(await c.fine_tuning_events(done["id"], limit=2)) == 2
        with pytest.raises(Conflict):
            await c.cancel_fine_tuning_job(done["id"])
        other = await c.create_fine_tuning_job(DENSE, done["training_file"])
        assert (await c.cancel_fine_tuning_job(other["id"]))["status"] == "cancelled"
        assert (await c.upload_file(pairs(3), filename="x.jsonl"))["filename"] == "x.jsonl"


def test_upload_file_truncate(served: Served) -> None:
    """Today a long text is kept (flagged) and upload_file has no truncate: here it is
    a 400 naming the line, and truncate=True cuts it to train_max_chars (2000)."""
    long = pairs(3) + b'{"query": "q", "positive": "' + b"x" * 2100 + b'"}\n'
    with Client(served.url, api_key=ALICE) as c:
        with pytest.raises(InvalidInput, match="line 4 positive is 2,100 characters") as bad:
            c.upload_file(long)
        assert bad.value.field == "line 4"
        cut = c.upload_file(long, truncate=True)
        assert cut["rows"] == 4 and cut["warnings"] == [
            "line 4: positive was 2,100 characters; cut to 2,000 (truncate)"
        ]


def _mock(job: dict[str, Any], polls: list[float], done_after: int) -> httpx.MockTransport:
    """A server whose job runs quietly (no new event) for ``done_after`` polls, then
    ends as ``job`` says; ``polls`` gets the time of each job read."""
    import time

    events = [{"id": "ftevent-1-1", "type": "status", "created_at": 1, "message": "queued"}]

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            body: Any = {"object": "list", "data": events, "has_more": False}
        elif request.method == "POST" and request.url.path.endswith("/files"):
            body = {"id": "file-1", "object": "file", "bytes": 1, "filename": "p.jsonl"}
        elif request.method == "POST":
            body = {**job, "status": "queued", "finished_at": None}
        else:
            polls.append(time.monotonic())
            running = len(polls) <= done_after
            body = {**job, "status": "running", "finished_at": None} if running else job
            if not running:
                events.insert(0, {"id": "ftevent-1-2", "type": "status", "created_at": 100,
                                  "message": f"job {job['status']}"})  # fmt: skip
        return httpx.Response(200, content=msgspec.msgpack.encode(body))

    return httpx.MockTransport(handle)


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_fine_tune_raises_for_a_job_that_ends_without_a_model(status: str) -> None:
    error = {"code": "internal_error", "message": "the trainer ran out of memory"}
    job: dict[str, Any] = {"id": "ftjob-1", "status": status, "finished_at": 100,
                           "error": error if status == "failed" else None}  # fmt: skip
    with Client("http://t", transport=_mock(job, [], 1)) as c:
        assert c.wait_fine_tuning_job("ftjob-1", poll=0.01)["status"] == status  # returned
        with pytest.raises(fleetserve.FineTuningFailed) as info:
            c.fine_tune(DENSE, pairs())
    err = info.value
    assert err.status == status and err.job["id"] == "ftjob-1" and err.field == "job"
    assert f"fine-tuning job ftjob-1 {status}" in err.message
    assert ("ran out of memory" in err.message) is (status == "failed")


def test_a_quiet_job_is_polled_less_and_less_often() -> None:
    job: dict[str, Any] = {"id": "ftjob-1", "status": "succeeded", "finished_at": 100}
    polls: list[float] = []
    with Client("http://t", transport=_mock(job, polls, 6)) as c:
        assert c.wait_fine_tuning_job("ftjob-1", poll=0.05)["status"] == "succeeded"
    gaps = [b - a for a, b in itertools.pairwise(polls[:6])]
    # poll after the first read (it saw a new event), then 1.5 times longer each time
    assert gaps[-1] >= 0.05 * 1.5**4 and gaps[-1] > 3 * gaps[0], gaps
