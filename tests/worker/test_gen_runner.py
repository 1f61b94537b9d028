"""The generation runner: continuous batching across requests, streaming, cancellation,
deadlines, and the external runtime, on a tiny random Llama."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleetserve.catalog import ModelSpec, Profile
from fleetserve.families.generate import GenerateFamily
from fleetserve.metrics import Metrics
from fleetserve.queue import Message
from fleetserve.runtimes import Generation, Head, SamplingParams
from fleetserve.wire import FleetError, InternalError, Unavailable
from fleetserve.worker.batcher import Job
from fleetserve.worker.gen_runner import GenerationRunner

from ..sinks import settle
from ..tiny_generate import build_llama, chat_body, envelope, load_adapter, stop
from ..waiting import async_wait_for

_ids = itertools.count(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(Path(tmp_path_factory.mktemp("tiny-llama")), max_positions=512)


@pytest.fixture(scope="module")
def adapter(model_dir: Path) -> Any:
    return load_adapter(model_dir, max_seq_len=512)


class Harness:
    """Plays the worker: records finishes, chunks and failures in order."""

    def __init__(self, runner: GenerationRunner) -> None:
        self.runner = runner
        self.log: list[tuple[str, str]] = []  # (what, request id)
        self.chunks: dict[str, list[bytes]] = {}
        self.done: dict[str, asyncio.Future[Job]] = {}
        self.errors: dict[str, FleetError] = {}
        self.room = asyncio.Event()

    def job(self, body: bytes, task: str = "chat") -> Job:
        n = next(_ids)
        env = dataclasses.replace(envelope(task), request_id=f"r{n}")
        prepared = self.runner.family.preprocess(env, body)
        job = Job(Message(env, body, n), prepared, time.time())
        self.done[env.request_id] = asyncio.get_running_loop().create_future()
        self.chunks[env.request_id] = []
        self.runner.submit(job)
        return job

    def finish(self, job: Job) -> None:
        rid = job.msg.envelope.request_id
        self.log.append(("finish", rid))
        self.done[rid].set_result(job)

    def chunk(self, job: Job, body: bytes) -> None:
        rid = job.msg.envelope.request_id
        self.log.append(("chunk", rid))
        self.chunks[rid].append(body)

    async def crash(self, job: Job, err: FleetError) -> None:
        await self._fail("crash", job, err)

    async def expire(self, job: Job) -> None:
        await self._fail("expire", job, InternalError("expired"))

    async def fail(self, job: Job, err: FleetError) -> None:
        await self._fail("fail", job, err)

    def running(self, job: Job) -> None:
        self.log.append(("running", job.msg.envelope.request_id))

    def freed(self) -> None:
        self.room.set()

    async def relieve(self, model: str) -> bool:
        return False

    async def _fail(self, what: str, job: Job, err: FleetError) -> None:
        settle(job)
        rid = job.msg.envelope.request_id
        self.log.append((what, rid))
        self.errors[rid] = err
        self.done[rid].set_exception(err)

    async def first_text(self, job: Job) -> None:
        rid = job.msg.envelope.request_id
        while len(self.chunks[rid]) < 2:  # the opening event, then text
            await asyncio.sleep(0.002)

    def run(self) -> asyncio.Task[None]:
        r = self.runner
        return asyncio.create_task(r.run(self))


def _runner(adapter: Any, max_batch_size: int = 8) -> GenerationRunner:
    profile = Profile("cpu", max_batch_tokens=8192, max_batch_size=max_batch_size)
    runner = GenerationRunner(adapter.spec, profile, adapter, Metrics())
    runner.loaded = True
    return runner


def _text(chunks: list[bytes]) -> str:
    out = []
    for c in chunks:
        for event in c.decode().split("\n\n"):
            if event.startswith("data: {"):
                for choice in json.loads(event[6:])["choices"]:
                    out.append(choice["delta"].get("content") or "")
    return "".join(out)


async def test_a_request_joins_while_another_is_mid_generation(adapter: Any) -> None:
    solo = adapter.forward(
        adapter.preprocess(
            envelope(), chat_body("hello world", max_tokens=150, temperature=0)
        ).items
    )
    assert solo[0].generation.completion_tokens == 150  # no early EOS: a long first request
    h = Harness(_runner(adapter))
    task = h.run()
    try:
        a = h.job(chat_body("hello world", max_tokens=150, temperature=0, stream=True))
        await h.first_text(a)
        b = h.job(chat_body("the fox", max_tokens=5, temperature=0, stream=True))
        await h.done[b.msg.envelope.request_id]
        assert not h.done[a.msg.envelope.request_id].done()  # b finished while a runs
        await h.done[a.msg.envelope.request_id]
    finally:
        await stop(task)
    ra, rb = a.msg.envelope.request_id, b.msg.envelope.request_id
    b_first = h.log.index(("chunk", rb))
    assert ("chunk", ra) in h.log[b_first + 1 :]  # a kept streaming after b joined
    assert h.log.index(("finish", rb)) < h.log.index(("finish", ra))
    # joining a running batch changes no token: same text as alone
    alone_b = adapter.forward(
        adapter.preprocess(envelope(), chat_body("the fox", max_tokens=5, temperature=0)).items
    )
    assert a.outputs[0].generation.text == solo[0].generation.text
    assert b.outputs[0].generation.text == alone_b[0].generation.text


async def test_stream_chunks_concatenate_to_the_text_and_end_with_done(adapter: Any) -> None:
    h = Harness(_runner(adapter))
    task = h.run()
    try:
        job = h.job(chat_body("hi", max_tokens=20, temperature=0, stream=True))
        await h.done[job.msg.envelope.request_id]
    finally:
        await stop(task)
    chunks = h.chunks[job.msg.envelope.request_id]
    first = json.loads(chunks[0].decode()[6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    out = job.outputs[0]
    assert out.streamed and _text(chunks) == out.generation.text and len(chunks) > 2
    tail = adapter.postprocess(job.msg.envelope, job.prepared, job.outputs)
    assert tail.endswith(b"data: [DONE]\n\n") and _text([tail]) == ""
    assert json.loads(tail.split(b"\n\n")[0][6:])["choices"][0]["finish_reason"] == "length"


async def test_a_cancelled_request_stops_generating(adapter: Any) -> None:
    runner = _runner(adapter)
    h = Harness(runner)
    task = h.run()
    try:
        job = h.job(chat_body("hello", max_tokens=400, temperature=0, stream=True))
        await h.first_text(job)
        settle(job)  # the worker answered it (a client gone, a failure elsewhere)
        await async_wait_for(lambda: runner._live == {}, 5, "the runner to drop the job")
        n = len(h.chunks[job.msg.envelope.request_id])
        await asyncio.sleep(0.2)  # a window in which a step still running would send more
        assert len(h.chunks[job.msg.envelope.request_id]) == n
        assert runner._live == {} and not h.done[job.msg.envelope.request_id].done()
    finally:
        await stop(task)


async def test_a_cancelled_sequence_is_no_row_of_the_step_that_lets_it_go(
    adapter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel and a newcomer that the runner takes in between the same two steps: the
    next step runs the newcomer alone, and the batch size it records says one row."""
    inside, go = threading.Event(), threading.Event()
    make = adapter.engine

    def held_engine() -> Any:
        engine = make()
        step = engine.step

        def held() -> Any:
            if not go.is_set():
                inside.set()
                go.wait(10)
            return step()

        engine.step = held
        return engine

    monkeypatch.setattr(adapter, "engine", held_engine)
    go.set()
    runner = _runner(adapter)
    model = adapter.spec.id
    h = Harness(runner)
    task = h.run()
    try:
        a = h.job(chat_body("hello", max_tokens=400, temperature=0, stream=True))
        await h.first_text(a)
        go.clear()  # the next step waits, a's row in it
        assert await asyncio.to_thread(inside.wait, 10)
        settle(a)  # its client left
        b = h.job(chat_body("the fox", max_tokens=4, temperature=0))
        go.set()
        await h.done[b.msg.envelope.request_id]
    finally:
        await stop(task)

    def sample(name: str) -> float:
        value = runner.metrics.registry.get_sample_value(name, {"model": model})
        return value or 0.0

    steps, rows = sample("fleetserve_batch_size_count"), sample("fleetserve_batch_size_sum")
    assert steps > 4 and rows == steps  # a alone until it left, then b alone


async def test_a_request_past_its_deadline_is_expired_mid_generation(adapter: Any) -> None:
    h = Harness(_runner(adapter))
    task = h.run()
    try:
        job = h.job(chat_body("hello", max_tokens=400, temperature=0, stream=True))
        await h.first_text(job)
        env = dataclasses.replace(job.msg.envelope, deadline=time.time() - 1)
        job.msg = Message(env, job.msg.body, job.msg.delivery_id)
        with pytest.raises(FleetError):
            await h.done[env.request_id]
    finally:
        await stop(task)
    assert ("expire", env.request_id) in h.log


class FakeExternal:
    """Stands in for ExternalRuntime: two text deltas per sequence, counted concurrency."""

    name = "external"
    device = "cpu"
    precision = "fp32"

    def __init__(self) -> None:
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def load(self, path: Path | None = None, head: Head = Head.BASE) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0

    def generate(self, ids: list[int], params: SamplingParams, on_text: Any = None) -> Generation:
        if params.stop == ("fail",):
            raise Unavailable("the model server is down", retry_after=1.0)
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            for piece in ("a", "b"):
                time.sleep(0.05)
                if on_text is not None:
                    on_text(piece)
        finally:
            with self.lock:
                self.active -= 1
        return Generation("ab", "stop", len(ids), 2)


async def test_the_external_runtime_generates_each_sequence_within_the_batch_cap(
    model_dir: Path,
) -> None:
    spec = ModelSpec("tiny/ext", "generate", "external", (str(model_dir),), max_seq_len=512)
    fake = FakeExternal()
    adapter = GenerateFamily(spec, fake, model_dir)  # type: ignore[arg-type]
    adapter.load()
    h = Harness(_runner(adapter, max_batch_size=2))
    task = h.run()
    try:
        jobs = [h.job(chat_body(f"q{i}", stream=i % 2 == 0)) for i in range(5)]
        bad = h.job(chat_body("q", stop="fail"))
        with pytest.raises(Unavailable):
            await h.done[bad.msg.envelope.request_id]
        for j in jobs:
            await h.done[j.msg.envelope.request_id]
    finally:
        await stop(task)
    assert fake.peak == 2  # max_batch_size sequences in flight, no more
    for i, j in enumerate(jobs):
        assert j.outputs[0].generation.text == "ab"
        assert j.outputs[0].streamed == (i % 2 == 0)
        if i % 2 == 0:
            assert _text(h.chunks[j.msg.envelope.request_id]) == "ab"
    assert ("crash", bad.msg.envelope.request_id) in h.log


async def test_a_failed_step_crashes_its_jobs_and_the_runner_goes_on(
    adapter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetserve.families.generate.engine import Engine

    real_step = Engine.step

    def step_once_broken(self: Engine) -> Any:
        monkeypatch.setattr(Engine, "step", real_step)
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(Engine, "step", step_once_broken)
    h = Harness(_runner(adapter))
    task = h.run()
    try:
        bad = h.job(chat_body("hi", max_tokens=5, temperature=0))
        with pytest.raises(FleetError, match="inference failed: RuntimeError"):
            await h.done[bad.msg.envelope.request_id]
        assert "out of memory" in bad.reason
        good = h.job(chat_body("hi", max_tokens=5, temperature=0))
        await h.done[good.msg.envelope.request_id]
    finally:
        await stop(task)


async def test_a_step_failing_mid_prefill_crashes_the_newcomers_too(
    adapter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler raising in a prefill: the newcomers were out of the engine's queues
    (in the step's locals), and used to be left unanswered until their deadline."""
    from fleetserve.families.generate import engine as engine_module

    real_choose = engine_module.choose

    def choose_once_broken(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(engine_module, "choose", real_choose)
        raise RuntimeError("probability tensor contains nan")

    monkeypatch.setattr(engine_module, "choose", choose_once_broken)
    h = Harness(_runner(adapter))
    task = h.run()
    try:
        bad = h.job(chat_body("hi", max_tokens=5, temperature=1))  # sampled, not greedy
        with pytest.raises(FleetError, match="inference failed: RuntimeError"):
            await asyncio.wait_for(h.done[bad.msg.envelope.request_id], 10)
        good = h.job(chat_body("hi", max_tokens=5, temperature=0))
        await asyncio.wait_for(h.done[good.msg.envelope.request_id], 10)
    finally:
        await stop(task)


async def test_a_broken_generation_thread_fails_the_runner(
    adapter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_engine() -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(adapter, "engine", no_engine)
    h = Harness(_runner(adapter))
    task = h.run()
    h.job(chat_body("hi", max_tokens=5))
    with pytest.raises(RuntimeError, match="generation thread"):
        await asyncio.wait_for(task, 10)


async def test_native_generate_streams_text_events(adapter: Any) -> None:
    h = Harness(_runner(adapter))
    task = h.run()
    try:
        body = json.dumps({"prompt": "the fox", "max_tokens": 12, "temperature": 0, "stream": True})
        job = h.job(body.encode(), task="generate")
        await h.done[job.msg.envelope.request_id]
    finally:
        await stop(task)
    tail = adapter.postprocess(job.msg.envelope, job.prepared, job.outputs)
    raw = b"".join([*h.chunks[job.msg.envelope.request_id], tail]).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    objs = [json.loads(e[6:]) for e in events[:-1]]
    assert all(o["id"] == "gen-" + job.msg.envelope.request_id for o in objs)
    assert "".join(o["text"] for o in objs) == job.outputs[0].generation.text
    assert objs[-1]["finish_reason"] == "length" and objs[-1]["usage"]["completion_tokens"] == 12


async def test_an_evicted_generator_lets_go_of_its_adapter_and_serves_after_reload(
    adapter: Any,
) -> None:
    runner = _runner(adapter)
    h = Harness(runner)
    task = h.run()
    try:
        first = h.job(chat_body("hello", max_tokens=3, temperature=0))
        await h.done[first.msg.envelope.request_id]
        old = runner._thread
        assert old is not None and old.is_alive()
        runner.unload()  # what the fleet does when it evicts it
        await asyncio.to_thread(old.join, 5)
        assert not old.is_alive() and runner.family_or_none is None
        await runner.load()  # the factory gives the same adapter back: load it again
        again = h.job(chat_body("hello", max_tokens=3, temperature=0))
        await h.done[again.msg.envelope.request_id]
        assert runner._thread is not old and runner._thread is not None
        text = again.outputs[0].generation.text
        assert text == first.outputs[0].generation.text
    finally:
        await stop(task)


async def test_a_generator_is_charged_its_kv_cache_at_its_full_token_budget(
    adapter: Any,
) -> None:
    """The KV cache of ``max_batch_tokens`` running tokens (admission holds the
    running prompts and completions within it) is charged while the model is resident,
    beside its weights (``Footprint.state``)."""
    runner = _runner(adapter)
    runner.unload()
    held = await runner.load()
    kv = adapter.kv_cache_bytes(8192)
    assert held.state == kv == runner.memory["kv_cache"] > 0
    assert held.kept == held.weights + kv and held.total == held.kept + held.peak
    runner.unload()
