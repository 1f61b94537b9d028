"""Swapping a served model to a new profile between batches (``worker.swap``), on tiny
real models through the real path: a MemoryQueue, a Worker, the runners that
``build_runner`` makes, the fleet's memory budget and the shared compute thread."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from fleetserve.assembly import build_runner, interactive_tokens
from fleetserve.catalog import Catalog, ModelSpec, Profile
from fleetserve.catalog.profiles import Choice
from fleetserve.catalog.rules import missing_extra
from fleetserve.families import create_family
from fleetserve.fleet.manager import Fleet, State
from fleetserve.fleet.policy import GDSF
from fleetserve.gateway import envelope as env_mod
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue, Message
from fleetserve.runtimes import create_runtime
from fleetserve.settings import Settings
from fleetserve.wire import Encoding, FleetError, Task, error_from_body
from fleetserve.worker import ModelRunner, Worker
from fleetserve.worker.batcher import Job
from fleetserve.worker.compute import compute_executor
from fleetserve.worker.gen_runner import GenerationRunner
from fleetserve.worker.runner import Runner
from fleetserve.worker.swap import swap_profile

from ..conftest import TINY_CLASS, tiny_settings
from ..sinks import CallbackSink
from ..tiny_generate import build_llama, chat_body, envelope
from ..tinymodels import WORDS, build_bert, write_spec

MODEL, PINNED, IDLE = "swap/dense", "swap/pinned", "swap/idle"
LLAMA = "tiny/llama"  # the id tests/tiny_generate's envelopes carry
UNBOUNDED = 1 << 62
TEXTS = [" ".join(WORDS[i : i + 1 + i % 7]) for i in range(0, 40, 3)]  # 1 to 7 words
NEW_RUNTIME = "onnx" if not missing_extra("onnx") else "torch"  # torch: budgets only


def choice(runtime: str, tokens: int, size: int, cap: int) -> Choice:
    profile = Profile(
        TINY_CLASS, precision="fp32", runtime=runtime, max_batch_tokens=tokens,
        max_batch_size=size, priority_cap=cap,
    )  # fmt: skip
    return Choice(profile, "tuned", f"{runtime} {tokens}/{size} for the swap tests")


OLD = choice("torch", 256, 8, 128)
NEW = choice(NEW_RUNTIME, 128, 4, 64)
NEW_TORCH = choice("torch", 192, 6, 64)  # another torch profile: no export at its load


@dataclasses.dataclass
class Setup:
    settings: Settings
    specs: dict[str, ModelSpec]
    reference: dict[str, np.ndarray[Any, Any]]  # torch fp32, one text at a time


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("swap")
    bert = build_bert(root / "bert")
    llama = build_llama(root / "llama")
    cat = root / "catalog"
    for model in (MODEL, PINNED, IDLE):
        write_spec(cat, model, bert, pinned=model == PINNED)
    write_spec(cat, LLAMA, llama, family="generate", max_seq_len=512)
    settings = tiny_settings(cat, models="", cache_dir=str(root / "cache"))
    catalog = Catalog.load([cat], bundled=False)
    specs = {s.id: s for s in catalog}
    spec = specs[MODEL]
    ref = create_family(spec, create_runtime("torch", device="cpu", precision="fp32"), bert)
    ref.load()
    env = request_envelope(MODEL, b"")
    reference = {}
    for text in TEXTS:
        body = json.dumps({"inputs": [text]}).encode()
        prepared = ref.preprocess(env, body)
        out = ref.postprocess(env, prepared, list(ref.forward(prepared.items)))
        reference[text] = np.asarray(json.loads(out)["embeddings"][0], dtype=np.float32)
    return Setup(settings, specs, reference)


def request_envelope(model: str, body: bytes) -> Any:
    return env_mod.build(
        model=model, task=Task.ENCODE, content_type=Encoding.JSON, accept=Encoding.JSON,
        body_size=len(body), timeout=120.0, request_id=None, tenant=None,
    )  # fmt: skip


class Serving:
    """A worker serving ``runners`` from a MemoryQueue, with a fleet of ``budget`` bytes."""

    def __init__(self, runners: Mapping[str, Runner], budget: int = UNBOUNDED) -> None:
        self.metrics = Metrics()
        self.queue = MemoryQueue(max_depth=1 << 16)
        self.fleet = Fleet(budget, GDSF(), metrics=self.metrics, room_wait=0.0)
        for r in runners.values():
            self.fleet.add(r)
        self.worker = Worker(self.queue, runners, self.metrics, fleet=self.fleet)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Serving:
        await self.queue.start()
        self._task = asyncio.create_task(self.worker.run())
        while not self.worker.running:
            await asyncio.sleep(0)  # the worker's first step sets it
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.queue.close()
        self.worker.close()

    async def load(self, model: str) -> None:
        await self.fleet.acquire(model, timeout=120.0)
        self.fleet.release(model)

    async def encode(self, model: str, texts: list[str]) -> np.ndarray[Any, Any]:
        body = json.dumps({"inputs": texts}).encode()
        pending = await self.queue.publish(request_envelope(model, body), body)
        reply = await pending.wait(120.0)
        if reply.error is not None:
            raise error_from_body(reply.error)
        return np.asarray(json.loads(reply.body)["embeddings"], dtype=np.float32)


def runner(setup: Setup, model: str, chosen: Choice, **spec: Any) -> ModelRunner:
    got = build_runner(
        dataclasses.replace(setup.specs[model], **spec), setup.settings, Metrics(), chosen
    )
    assert isinstance(got, ModelRunner)
    return got


def check(setup: Setup, texts: list[str], got: np.ndarray[Any, Any]) -> None:
    want = np.stack([setup.reference[t] for t in texts])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def serves(r: ModelRunner, chosen: Choice, settings: Settings) -> None:
    """``r`` serves ``chosen``: its profile, runtime and batch budgets."""
    assert r.profile == chosen.profile
    assert r.family.runtime.name == chosen.profile.runtime
    assert r.waiting.max_batch_tokens == chosen.profile.max_batch_tokens
    assert r.waiting.max_batch_size == chosen.profile.max_batch_size
    assert r.waiting.interactive_tokens == interactive_tokens(chosen, settings)


# -- a resident model, under load --------------------------------------------------
@pytest.mark.slow
async def test_a_swap_under_four_busy_clients_fails_no_request(setup: Setup) -> None:
    old, new = runner(setup, MODEL, OLD), runner(setup, MODEL, NEW)
    async with Serving({MODEL: old}) as s:
        await s.load(MODEL)
        serves(old, OLD, setup.settings)
        first = weakref.ref(old.family)
        replies = {"before": 0, "after": 0}
        bad: list[str] = []
        warm, swapped, enough, stop = (asyncio.Event() for _ in range(4))

        async def client(i: int) -> None:
            k = i
            while not stop.is_set():
                texts = [TEXTS[(k + j) % len(TEXTS)] for j in range(1 + k % 3)]
                k += 4
                when = "after" if swapped.is_set() else "before"  # as it is sent
                try:
                    check(setup, texts, await s.encode(MODEL, texts))
                except (FleetError, AssertionError) as exc:
                    bad.append(f"{when}: {type(exc).__name__}: {exc}")
                    enough.set()  # the test ends, and fails
                replies[when] += 1
                if replies["before"] >= 12:
                    warm.set()
                if replies["after"] >= 40:
                    enough.set()

        clients = [asyncio.create_task(client(i)) for i in range(4)]
        await asyncio.wait_for(warm.wait(), 120)
        result = await swap_profile(s.fleet, old, new)
        swapped.set()
        await asyncio.wait_for(enough.wait(), 300)
        stop.set()
        await asyncio.gather(*clients)
        assert not bad, bad[:3]
        assert result.swapped, result.reason
        assert replies["after"] >= 40
        serves(old, NEW, setup.settings)  # the served runner now runs the new profile
        assert s.worker.pull_budget == NEW.profile.max_batch_tokens  # it pulls for it too
        info = s.fleet.info(MODEL)
        assert info["state"] == "resident" and info["inflight"] == 0
        assert info["bytes"] == result.after == old.expected().total == s.fleet.used()
        gc.collect()
        assert first() is None  # the old adapter was let go: only the new one is held


@pytest.mark.slow
async def test_room_beside_is_made_by_the_policy_never_from_a_pinned_model(
    setup: Setup,
) -> None:
    target, pinned, idle = (runner(setup, m, OLD) for m in (MODEL, PINNED, IDLE))
    new = runner(setup, MODEL, NEW_TORCH)
    async with Serving({MODEL: target, PINNED: pinned, IDLE: idle}) as s:
        for m in (PINNED, IDLE, MODEL):
            await s.load(m)
        need = new.expected().weights
        # room for the new weights only once the idle model's weights leave
        s.fleet.room.budget = s.fleet.used() + need - idle.memory["weights"] // 2
        result = await swap_profile(s.fleet, target, new)
        assert result.swapped, result.reason
        assert s.fleet.state(IDLE) is State.COLD  # evicted by the policy
        assert s.fleet.state(PINNED) is State.RESIDENT
        serves(target, NEW_TORCH, setup.settings)
        check(setup, TEXTS[:3], await s.encode(MODEL, TEXTS[:3]))


async def test_no_room_beside_refuses_and_the_old_profile_keeps_serving(setup: Setup) -> None:
    target, pinned = runner(setup, MODEL, OLD), runner(setup, PINNED, OLD)
    new = runner(setup, MODEL, NEW_TORCH)
    async with Serving({MODEL: target, PINNED: pinned}) as s:
        await s.load(PINNED)
        await s.load(MODEL)
        s.fleet.room.budget = s.fleet.used() + new.expected().weights // 2  # the old and half
        served, used, info = target.family, s.fleet.used(), s.fleet.info(MODEL)
        result = await swap_profile(s.fleet, target, new)
        assert not result.swapped
        assert result.reason.startswith("refused: ") and f"{PINNED} " in result.reason
        assert "pinned" in result.reason
        assert result.before == result.after == info["bytes"]
        assert target.family is served and not new.loaded
        serves(target, OLD, setup.settings)
        assert s.fleet.used() == used and s.fleet.info(MODEL) == info
        assert s.fleet.state(PINNED) is State.RESIDENT
        check(setup, TEXTS[:3], await s.encode(MODEL, TEXTS[:3]))


# -- a model that is not resident --------------------------------------------------
async def test_a_model_never_loaded_adopts_without_loading(setup: Setup) -> None:
    old, new = runner(setup, MODEL, OLD), runner(setup, MODEL, NEW)
    async with Serving({MODEL: old}) as s:
        result = await swap_profile(s.fleet, old, new)
        assert result.swapped and "adopted" in result.reason, result.reason
        assert not old.ever_loaded and not new.loaded and s.fleet.state(MODEL) is State.COLD
        assert old.profile == NEW.profile and old.waiting.max_batch_tokens == 128
        assert result.after == s.fleet.info(MODEL)["bytes"] == new.expected().total
        check(setup, TEXTS[:4], await s.encode(MODEL, TEXTS[:4]))  # its first load
        serves(old, NEW, setup.settings)


@pytest.mark.slow
async def test_an_evicted_model_adopts_and_its_next_load_uses_the_new_profile(
    setup: Setup,
) -> None:
    old, idle = runner(setup, MODEL, OLD), runner(setup, IDLE, OLD)
    new = runner(setup, MODEL, NEW)
    async with Serving({MODEL: old, IDLE: idle}) as s:
        await s.load(MODEL)
        s.fleet.room.budget = s.fleet.used() + idle.expected().weights // 2  # for one of the two
        await s.load(IDLE)
        assert s.fleet.state(MODEL) is State.COLD
        measured_old = s.fleet.info(MODEL)["bytes"]  # what its next load would reserve
        result = await swap_profile(s.fleet, old, new)
        assert result.swapped and result.before == measured_old, result
        assert s.fleet.info(MODEL)["bytes"] == new.expected().total == result.after
        assert not new.loaded
        # room for the new profile's reservation or for IDLE, not both: each load's
        # measured peak (resident growth) varies, so the room is set from what is
        # reserved now, not from the first load's figures
        s.fleet.room.budget = s.fleet.used() + new.expected().total - 1
        check(setup, TEXTS[5:8], await s.encode(MODEL, TEXTS[5:8]))  # reloads, IDLE leaves
        assert s.fleet.state(IDLE) is State.COLD
        serves(old, NEW, setup.settings)


# -- a new profile that fails to load ------------------------------------------------
def missing_weights(setup: Setup) -> ModelRunner:
    return runner(setup, MODEL, NEW, sources=(str(setup.specs[MODEL].sources[0]) + "-gone",))


def out_of_memory(setup: Setup) -> ModelRunner:
    def factory() -> Any:
        raise MemoryError("out of memory (a test's factory)")

    return ModelRunner(setup.specs[MODEL], NEW.profile, factory, Metrics(), eager=False)


@pytest.mark.parametrize("failing", [missing_weights, out_of_memory])
async def test_a_new_profile_that_fails_to_load_leaves_the_old_serving(
    setup: Setup, failing: Callable[[Setup], ModelRunner]
) -> None:
    old, new = runner(setup, MODEL, OLD), failing(setup)
    async with Serving({MODEL: old}) as s:
        await s.load(MODEL)
        served, used, info = old.family, s.fleet.used(), s.fleet.info(MODEL)
        result = await swap_profile(s.fleet, old, new)
        assert not result.swapped
        want = "out of memory" if failing is out_of_memory else "failed"
        assert result.reason.startswith(want), result.reason
        assert result.before == result.after == info["bytes"]
        assert old.family is served
        serves(old, OLD, setup.settings)
        assert s.fleet.used() == used and s.fleet.info(MODEL) == info
        check(setup, TEXTS[:2], await s.encode(MODEL, TEXTS[:2]))


# -- generation: continuous batching -------------------------------------------------
@contextlib.contextmanager
def compute_held() -> Iterator[threading.Event]:
    """The shared compute thread blocked until the block ends (or the event is set)."""
    gate = threading.Event()
    fut = compute_executor().submit(gate.wait, 60)
    try:
        yield gate
    finally:
        gate.set()
        fut.result(60)


async def test_generation_swaps_only_while_no_sequence_runs(setup: Setup) -> None:
    def gen(chosen: Choice) -> GenerationRunner:
        got = build_runner(setup.specs[LLAMA], setup.settings, Metrics(), chosen)
        assert isinstance(got, GenerationRunner)
        return got

    old = gen(choice("torch", 4096, 4, 0))
    fleet = Fleet(UNBOUNDED, GDSF(), room_wait=0.0)
    fleet.add(old)
    await fleet.acquire(LLAMA, timeout=120.0)
    fleet.release(LLAMA)
    loop = asyncio.get_running_loop()
    opened: dict[str, asyncio.Event] = {}
    done: dict[str, asyncio.Future[Job]] = {}

    def submit(rid: str) -> None:
        env = dataclasses.replace(envelope(), request_id=rid)
        body = chat_body("hello world", max_tokens=64, temperature=0, stream=True)
        opened[rid], done[rid] = asyncio.Event(), loop.create_future()
        old.submit(Job(Message(env, body, 1), old.family.preprocess(env, body), time.time()))

    def chunk(job: Job, body: bytes) -> None:
        opened[job.msg.envelope.request_id].set()  # the first: its sequence was admitted

    def finish(job: Job) -> None:
        done[job.msg.envelope.request_id].set_result(job)

    async def failed(job: Job, err: FleetError) -> None:
        done[job.msg.envelope.request_id].set_exception(err)

    task = asyncio.create_task(old.run(CallbackSink(finish, failed, chunk)))
    try:
        with compute_held():  # its steps wait: the sequence keeps running
            submit("r1")
            await asyncio.wait_for(opened["r1"].wait(), 60)
            busy = await swap_profile(fleet, old, gen(choice("torch", 2048, 2, 0)))
        assert not busy.swapped and busy.reason == "busy: running sequences"
        assert old.profile.max_batch_size == 4 and old.max_sequences == 4
        await asyncio.wait_for(done["r1"], 60)
        newer = choice("torch", 2048, 2, 0)
        result = await swap_profile(fleet, old, gen(newer))  # idle now
        assert result.swapped, result.reason
        assert old.profile == newer.profile and old.waiting.max_batch_tokens == 2048
        assert old.max_sequences == 2
        submit("r2")  # a new generation thread, on the new adapter
        job = await asyncio.wait_for(done["r2"], 60)
        assert job.outputs
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
