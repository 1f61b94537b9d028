"""The fine-tuning API under the routes: nothing is queued for a bad job, jobs and files
stay within their tenant, a queued job cancels at once and a finished one refuses."""

from __future__ import annotations

import json

import pytest

from fleetserve.finetune_setup import FineTuningParts, requeue_unfinished
from fleetserve.lora.jobs.manager import FineTuning, TrainLimits, add_event
from fleetserve.lora.jobs.queue import JobRef, MemoryJobQueue
from fleetserve.lora.jobs.store import JobStore
from fleetserve.lora.store import AdapterStore
from fleetserve.storage import MemoryStore
from fleetserve.wire import (
    OPEN,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    Overloaded,
    Principal,
    Scope,
)
from fleetserve.wire.finetune import JobStatus

FAMILIES = {"tiny/dense": "dense", "tiny/rerank": "cross_encoder", "tiny/ner": "ner"}
ACME = Principal("acme", frozenset({Scope.ADAPTERS_WRITE, Scope.INFER}))
OTHER = Principal("other", frozenset({Scope.ADAPTERS_WRITE, Scope.INFER}))


def pairs(n: int, queries: int = 4) -> bytes:
    rows = ({"query": f"question {i % queries}", "positive": f"answer {i}"} for i in range(n))
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def make(max_queued: int = 10) -> tuple[FineTuning, MemoryJobQueue]:
    queue = MemoryJobQueue(max_queued)
    store = JobStore(AdapterStore(MemoryStore()))
    return FineTuning(store, queue, FAMILIES.get, TrainLimits(min_pairs=4)), queue


async def test_a_job_is_queued_once_with_its_events() -> None:
    ft, queue = make()
    f = await ft.create_file(ACME, "a.jsonl", pairs(8))
    assert (f.rows, f.tenant) == (8, "acme")
    job = await ft.create_job(
        ACME,
        {
            "model": "tiny/dense",
            "training_file": f.id,
            "hyperparameters": {"rank": 4},
            "suffix": "legal",
        },
    )
    assert job.status is JobStatus.QUEUED and job.hyperparameters.rank == 4
    assert (await ft.job(ACME, job.id)) == job
    lease = await queue.take(0.1)
    assert lease is not None and lease.ref == JobRef("acme", job.id)
    assert await queue.take(0.01) is None
    events, more = await ft.events(ACME, job.id, limit=1)
    assert more is not False and events[0]["message"] == "files validated; job queued"
    older, more = await ft.events(ACME, job.id, after=events[0]["id"])
    assert [e["message"] for e in older] == [f"created fine-tuning job {job.id}"] and not more
    assert [j.id for j in await ft.jobs(ACME)] == [job.id]
    assert await ft.jobs(OTHER) == []


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"model": "nope"}, "model", "unknown base model 'nope'"),
        ({"model": "tiny/ner"}, "model", "ner family: fine-tuning jobs train dense bases"),
        ({"model": "tiny/dense", "task": "rerank"}, "model", "'rerank' job trains a cross_enc"),
        ({"model": "tiny/rerank", "task": "embed"}, "model", "'embed' job trains a dense"),
        ({"task": "classify"}, "task", "task must be one of embed, rerank"),
        (
            {"model": "tiny/rerank", "hyperparameters": {"hard_negatives": 0}},
            "training_file",
            "no pair in training_file .* brings any",
        ),
        ({"model": "tiny/dense", "training_file": ""}, "training_file", "required"),
        ({"hyperparameters": {"epochs": 0}}, "hyperparameters.epochs", "between 1"),
        ({"validation_fraction": 0.9}, "validation_fraction", "between 0.01 and 0.5"),
        ({"margin": "big"}, "margin", "between -1 and 1"),
        ({"suffix": "a/b"}, "suffix", "letters, digits"),
        ({"epochs": 3}, "epochs", "unknown field 'epochs'"),
    ],
)
async def test_a_bad_job_names_its_field_and_queues_nothing(
    body: dict[str, object], field: str, words: str
) -> None:
    ft, queue = make()
    f = await ft.create_file(ACME, "a.jsonl", pairs(8))
    with pytest.raises(InvalidInput, match=words) as err:
        await ft.create_job(ACME, {"model": "tiny/dense", "training_file": f.id, **body})
    assert err.value.field == field
    assert await queue.take(0.01) is None and await ft.jobs(ACME) == []


async def test_a_reranker_job_mines_negatives_unless_told_and_may_bring_its_own() -> None:
    """A cross-encoder base trains a reranker: three negatives per pair unless the job
    says; with none mined, the pairs' own negatives are what it learns from."""
    ft, queue = make()
    f = await ft.create_file(ACME, "a.jsonl", pairs(8))
    job = await ft.create_job(ACME, {"model": "tiny/rerank", "training_file": f.id})
    assert job.hyperparameters.hard_negatives == 3
    said = await ft.create_job(
        ACME,
        {
            "model": "tiny/rerank",
            "training_file": f.id,
            "task": "rerank",
            "hyperparameters": {"hard_negatives": 1},
        },
    )
    assert said.hyperparameters.hard_negatives == 1
    rows = [{"query": f"question {i % 4}", "positive": f"answer {i}", "negative": ["no"]}
            for i in range(8)]  # fmt: skip
    own = await ft.create_file(
        ACME, "b.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()
    )
    none = await ft.create_job(ACME, {"model": "tiny/rerank", "training_file": own.id,
                                      "hyperparameters": {"hard_negatives": 0}})  # fmt: skip
    assert none.hyperparameters.hard_negatives == 0
    dense = await ft.create_job(ACME, {"model": "tiny/dense", "training_file": f.id})
    assert dense.hyperparameters.hard_negatives == 0  # an embedder's default is unchanged
    assert [(await queue.take(0.1)) is not None for _ in range(4)] == [True] * 4


async def test_files_belong_to_their_tenant() -> None:
    ft, _ = make()
    f = await ft.create_file(ACME, "a.jsonl", pairs(8))
    with pytest.raises(NotFound):
        await ft.create_job(OTHER, {"model": "tiny/dense", "training_file": f.id})
    with pytest.raises(NotFound):
        await ft.create_job(
            ACME, {"model": "tiny/dense", "training_file": f.id, "validation_file": "file-none"}
        )
    with pytest.raises(NotFound):
        await ft.file(OTHER, f.id)
    with pytest.raises(NotFound):  # an id is never a path
        await ft.file(ACME, "../acme/" + f.id)
    assert [x.id for x in await ft.files(ACME)] == [f.id] and await ft.files(OTHER) == []
    reader = Principal("acme", frozenset({Scope.INFER}))
    with pytest.raises(Forbidden):
        await ft.create_file(reader, "a.jsonl", pairs(8))


async def test_one_query_cannot_be_held_out() -> None:
    ft, _ = make()
    f = await ft.create_file(ACME, "a.jsonl", pairs(8, queries=1))
    with pytest.raises(InvalidInput, match="one distinct query") as err:
        await ft.create_job(ACME, {"model": "tiny/dense", "training_file": f.id})
    assert err.value.field == "validation_fraction"


async def test_a_job_checks_its_file_from_the_record_not_the_pairs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, each job created read the whole training file back and parsed every pair
    in the server (a 100 MiB file: hundreds of MiB a request) to see whether two
    queries could be split; now the file's record says it. A record from before that
    does not say still has its pairs read."""
    ft, _ = make()
    many = await ft.create_file(ACME, "a.jsonl", pairs(8))
    one = await ft.create_file(ACME, "b.jsonl", pairs(8, queries=1))

    async def no_pairs(*_a: object) -> None:
        raise AssertionError("the pairs were read")

    with monkeypatch.context() as m:
        m.setattr(ft.store, "pairs", no_pairs)
        await ft.create_job(ACME, {"model": "tiny/dense", "training_file": many.id})
        with pytest.raises(InvalidInput, match="one distinct query"):
            await ft.create_job(ACME, {"model": "tiny/dense", "training_file": one.id})
    key = f"finetune/files/acme/{one.id}.json"
    record = json.loads(await ft.store.store.get(key))
    assert record.pop("two_queries") is False
    await ft.store.store.put(key, json.dumps(record).encode())
    with pytest.raises(InvalidInput, match="one distinct query"):
        await ft.create_job(ACME, {"model": "tiny/dense", "training_file": one.id})


async def test_cancel_queued_at_once_and_finished_is_a_conflict() -> None:
    ft, _queue = make()
    f = await ft.create_file(OPEN, "a.jsonl", pairs(8))
    job = await ft.create_job(OPEN, {"model": "tiny/dense", "training_file": f.id})
    cancelled = await ft.cancel(OPEN, job.id)
    assert cancelled.status is JobStatus.CANCELLED and cancelled.finished_at is not None
    assert await ft.store.cancel_requested(job.tenant, job.id)  # a trainer that took it drops it
    with pytest.raises(Conflict, match="cancelled already"):
        await ft.cancel(OPEN, job.id)
    done = job.with_(id="ftjob-done", status=JobStatus.SUCCEEDED)
    await ft.store.put_job(done)
    with pytest.raises(Conflict, match="succeeded already"):
        await ft.cancel(OPEN, done.id)
    with pytest.raises(NotFound):
        await ft.cancel(ACME, job.id)


async def test_a_full_queue_fails_the_job_and_says_so() -> None:
    ft, _ = make(max_queued=1)
    f = await ft.create_file(ACME, "a.jsonl", pairs(8))
    first = await ft.create_job(ACME, {"model": "tiny/dense", "training_file": f.id})
    with pytest.raises(Overloaded):
        await ft.create_job(ACME, {"model": "tiny/dense", "training_file": f.id})
    # made in the same millisecond, the two may list in either order
    (second,) = [j for j in await ft.jobs(ACME) if j.id != first.id]
    assert second.status is JobStatus.FAILED and second.error is not None


async def test_unfinished_jobs_are_queued_again_at_start() -> None:
    ft, _ = make()
    f = await ft.create_file(ACME, "a.jsonl", pairs(8))
    a = await ft.create_job(ACME, {"model": "tiny/dense", "training_file": f.id})
    b = await ft.create_job(ACME, {"model": "tiny/dense", "training_file": f.id})
    await ft.store.put_job(b.with_(status=JobStatus.RUNNING))
    c = await ft.create_job(ACME, {"model": "tiny/dense", "training_file": f.id})
    await ft.store.put_job(c.with_(status=JobStatus.SUCCEEDED))
    fresh = MemoryJobQueue()  # a restarted server's
    assert await requeue_unfinished(FineTuningParts(ft, ft.store, fresh)) == 2
    taken = [await fresh.take(0.1) for _ in range(2)]
    assert {lease.ref.job_id for lease in taken if lease} == {a.id, b.id}
    assert (await ft.job(ACME, b.id)).status is JobStatus.QUEUED
    await add_event(ft.store, b, "x")
    assert (await ft.events(ACME, b.id))[0][0]["message"] == "x"
