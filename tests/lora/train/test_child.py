from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import multiprocessing
import os
import signal
import tempfile
import threading
from dataclasses import fields, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

from fleetserve.lora.shapes import linear_shapes
from fleetserve.lora.train import OutOfMemory, TrainResult, TrainSpec, child, train, train_in_child
from fleetserve.lora.train.errors import describe_error, is_out_of_memory, rebuild_error
from fleetserve.lora.validate import Limits, validate
from fleetserve.wire import Cancelled, InvalidInput
from tests.extras import TRAIN, needs
from tests.lora.train import Events, tiny_spec
from tests.tinymodels import build_bert
from tests.waiting import async_wait_for

# seconds each: `make test-fast` leaves it out
pytestmark = [
    pytest.mark.slow,
    needs(*TRAIN, extra="train"),
    pytest.mark.usefixtures("torch_threads"),
]


DEADLINE = 120.0  # seconds: the fork server imports torch on a busy machine


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> TrainSpec:
    return tiny_spec(build_bert(tmp_path_factory.mktemp("child") / "bert"), threads=1)


class Children(Events):
    """Events, and the pids of this process's live children when each came (and of
    their parents)."""

    def __init__(self) -> None:
        super().__init__()
        self.pids: set[int] = set()
        self.parents: set[int] = set()

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        super().__call__(kind, data)
        live = multiprocessing.active_children()
        pids = {p.pid for p in live if p.name == "fleetserve-train" and p.pid is not None}
        self.pids |= pids
        for pid in pids:
            with contextlib.suppress(OSError):
                self.parents.add(
                    int(
                        Path(f"/proc/{pid}/stat")
                        .read_text(encoding="utf-8")
                        .rsplit(")")[1]
                        .split()[1]
                    )
                )


def config_of(r: TrainResult) -> dict[str, Any]:
    """The adapter config, its target modules sorted: PEFT keeps them in a set, whose
    order varies between processes."""
    config: dict[str, Any] = json.loads(r.config)
    config["target_modules"] = sorted(config["target_modules"])
    return config


def gone(pid: int) -> bool:
    """No process, not even a zombie, has ``pid`` (it was reaped)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory this process makes the children's scratch in."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def assert_reaped(pids: set[int]) -> None:
    assert pids, "no child was seen"
    assert all(gone(pid) for pid in pids)
    assert not any(p.name == "fleetserve-train" for p in multiprocessing.active_children())


async def test_trains_in_a_child_and_relays_events(spec: TrainSpec, scratch: Path) -> None:
    events = Children()
    r = await asyncio.wait_for(train_in_child(spec, events), DEADLINE)
    assert os.listdir(scratch) == []  # the trainer's output directory is gone
    assert isinstance(r, TrainResult)
    here = train(spec, Events())  # the same spec in this process
    for f in fields(TrainResult):
        if f.name != "train_seconds":
            assert type(getattr(r, f.name)) is type(getattr(here, f.name)), f.name
    assert (r.steps, r.epochs, r.pairs, r.resumed_from_epoch) == (10, 2, 40, 0)
    assert (r.steps, r.mined_negatives) == (here.steps, here.mined_negatives)
    assert set(r.memory) == {"peak_growth"} and r.memory["peak_growth"] > 0  # no share
    assert config_of(r) == config_of(here)
    assert len(r.weights) == len(here.weights)
    validate(r.config, r.weights, base_model="b", base_shapes=linear_shapes(spec.base_path),
             limits=Limits())  # fmt: skip
    assert events.seen[0] == ("status", {"message": "loading the base model"})
    assert events.seen[1] == ("status", {"message": "measuring the base model"})
    assert [p["step"] for p in events.of("progress")] == list(range(1, 11))
    assert [c["epoch"] for c in events.of("checkpoint")] == [1, 2]
    assert isinstance(events.of("checkpoint")[0]["blob"], bytes)
    assert_reaped(events.pids)


async def test_cancel_terminates_the_child(spec: TrainSpec) -> None:
    cancel = asyncio.Event()
    events = Children()

    def on_event(kind: str, data: dict[str, Any]) -> None:
        events(kind, data)
        cancel.set()  # at the first event: the child is importing torch, loading

    with pytest.raises(Cancelled):
        await asyncio.wait_for(train_in_child(spec, on_event, cancel), DEADLINE)
    assert len(events.seen) >= 1
    assert_reaped(events.pids)


async def test_the_children_fork_from_one_server_that_has_imported_the_libraries(
    spec: TrainSpec,
) -> None:
    """Each job's child is forked from the same fork server (not this process), which
    imported torch and the training libraries before it forked any: a child starts
    without importing them again."""
    events = Children()
    for _ in range(2):
        cancel = asyncio.Event()

        def on_event(kind: str, data: dict[str, Any], cancel: asyncio.Event = cancel) -> None:
            events(kind, data)
            cancel.set()

        with pytest.raises(Cancelled):
            await asyncio.wait_for(train_in_child(spec, on_event, cancel), DEADLINE)
    assert len(events.pids) == 2 and len(events.parents) == 1, (events.pids, events.parents)
    (server,) = events.parents
    assert server != os.getpid()
    argv = Path(f"/proc/{server}/cmdline").read_bytes().decode()  # noqa: ASYNC240
    assert "multiprocessing.forkserver" in argv
    assert all(f"'{m}'" in argv for m in ("torch", "peft", "sentence_transformers")), argv
    assert_reaped(events.pids)


async def test_a_cancel_while_the_child_starts_returns_at_once_and_reaps_it_later(
    spec: TrainSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first job's start waits for the fork server's imports (seconds): a cancel
    meanwhile raises at once, and the child is stopped and reaped once it exists."""
    release, started = threading.Event(), threading.Event()
    real = BaseProcess.start

    def slow_start(proc: BaseProcess) -> None:  # a fork server still importing
        started.set()
        release.wait(60)
        real(proc)

    monkeypatch.setattr(BaseProcess, "start", slow_start)
    cancel = asyncio.Event()
    job = asyncio.ensure_future(train_in_child(spec, Events(), cancel))
    await asyncio.to_thread(started.wait, DEADLINE)
    cancel.set()
    try:
        with pytest.raises(Cancelled):
            await asyncio.wait_for(job, 30)  # a wait for the start: never, until release
        assert child._STOPPING, "the child is stopped once it has started"
    finally:
        release.set()
    await async_wait_for(lambda: not child._STOPPING, DEADLINE)  # started, stopped, joined
    assert not any(p.name == "fleetserve-train" for p in multiprocessing.active_children())


async def test_a_cancel_set_before_the_start_spawns_nothing(spec: TrainSpec) -> None:
    cancel = asyncio.Event()
    cancel.set()
    before = set(multiprocessing.active_children())
    with pytest.raises(Cancelled):
        await train_in_child(spec, Events(), cancel)
    assert set(multiprocessing.active_children()) == before


async def test_cancelling_the_task_reaps_the_child(spec: TrainSpec) -> None:
    events = Children()
    first = asyncio.Event()

    def on_event(kind: str, data: dict[str, Any]) -> None:
        events(kind, data)
        first.set()

    task = asyncio.ensure_future(train_in_child(spec, on_event))
    await asyncio.wait_for(first.wait(), DEADLINE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the reaping finishes in the background when the task is cancelled mid-shutdown;
    # here it was not, so it is done
    assert_reaped(events.pids)


async def test_a_child_that_dies_is_an_error_not_a_hang(spec: TrainSpec) -> None:
    events = Children()

    def on_event(kind: str, data: dict[str, Any]) -> None:
        events(kind, data)
        for pid in events.pids:
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(RuntimeError, match=r"died without a result.*SIGKILL"):
        await asyncio.wait_for(train_in_child(spec, on_event), DEADLINE)
    assert_reaped(events.pids)


async def test_a_child_killed_while_training_leaves_no_scratch_behind(
    spec: TrainSpec, scratch: Path
) -> None:
    """Killed mid-training, the child runs no cleanup of its own: its scratch directory
    (the trainer's output directory, which it makes) is removed here once it is reaped."""
    events = Children()
    made: list[Path] = []

    def on_event(kind: str, data: dict[str, Any]) -> None:
        events(kind, data)
        if kind == "progress" and not made:  # training: the trainer has made its directory
            made.extend(scratch.iterdir())
            for pid in events.pids:
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(RuntimeError, match=r"died without a result.*SIGKILL"):
        await asyncio.wait_for(train_in_child(spec, on_event), DEADLINE)
    assert_reaped(events.pids)
    assert len(made) == 1 and made[0].name.startswith("fleetserve-train-")
    assert os.listdir(scratch) == []


async def test_a_child_error_names_it(spec: TrainSpec, tmp_path: Path) -> None:
    missing = replace(spec, base_path=str(tmp_path / "no-such-model"))
    with pytest.raises(RuntimeError, match=r"FileNotFoundError: .*no-such-model") as exc:
        await asyncio.wait_for(train_in_child(missing, Events()), DEADLINE)
    assert "Traceback" not in str(exc.value)
    assert not any(p.name == "fleetserve-train" for p in multiprocessing.active_children())


async def test_a_fleetserve_error_keeps_its_type(spec: TrainSpec) -> None:
    with pytest.raises(InvalidInput, match="mean or cls") as exc:
        await asyncio.wait_for(train_in_child(replace(spec, pooling="none"), Events()), DEADLINE)
    assert exc.value.field == "model"


async def test_a_child_over_its_memory_limit_fails_saying_so(spec: TrainSpec) -> None:
    """Today there is no limit: the child grows until the kernel's OOM killer takes it
    (or the server), and the job says only "died without a result". Here the child caps
    its data segment at 256 MiB, which importing torch already passes."""
    events = Children()
    limit = 256 << 20
    with pytest.raises(OutOfMemory, match=r"ran out of memory .*limit 256 MiB, train_memory_limit"):
        await asyncio.wait_for(train_in_child(spec, events, memory_limit=limit), DEADLINE)
    assert not any(p.name == "fleetserve-train" for p in multiprocessing.active_children())


def test_what_counts_as_out_of_memory() -> None:
    """Today no error is told apart as running out of memory."""
    try:
        raise RuntimeError("wrapped") from MemoryError()
    except RuntimeError as exc:
        wrapped = exc
    for exc in (
        MemoryError(),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 1048576 bytes"
        ),
        OSError(errno.ENOMEM, "Cannot allocate memory"),
        ImportError("libtorch_cpu.so: failed to map segment from shared object"),
        wrapped,
    ):
        assert is_out_of_memory(exc), exc
        assert describe_error(exc)["type"] == "OutOfMemory"
    for exc in (RuntimeError("shapes do not match"), ValueError("memory")):
        assert not is_out_of_memory(exc), exc
    said = rebuild_error(describe_error(MemoryError()), 3 << 30)
    assert isinstance(said, OutOfMemory)
    assert str(said) == (
        "the training process ran out of memory (limit 3.0 GiB, train_memory_limit): MemoryError"
    )


@pytest.fixture(scope="module")
def wide_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT wide and long enough that a text of 512 tokens costs tens of MiB to train
    on (hidden 256, 4 layers): what a share has to be fitted to."""
    return build_bert(tmp_path_factory.mktemp("wide") / "bert", hidden=256, layers=4,
                      max_positions=512)  # fmt: skip


async def test_a_share_runs_the_batch_in_micro_batches_and_the_child_stays_within_it(
    wide_bert: Path,
) -> None:
    """With 400 MiB to grow by, a batch of 8 texts of up to 512 tokens runs a few texts
    at a time, the feed says how, and the child's resident set grows by no more than
    the share (within the 10 % the fleet's drift check allows)."""
    share = 400 << 20
    events = Events()
    spec = replace(tiny_spec(wide_bert), max_seq_len=512, memory_share=share)
    result = await asyncio.wait_for(train_in_child(spec, events), DEADLINE)
    memory = result.memory
    assert memory["share"] == share and 1 <= memory["micro_batch"] < 8
    assert memory["max_seq_len"] == 512 and result.steps > 0
    assert 0 < memory["peak_growth"] <= 1.1 * share, memory
    said = [d["message"] for k, d in events.seen if k == "status"]
    assert any(f"batches of 8 run {memory['micro_batch']} text" in m for m in said), said


async def test_a_share_too_small_for_one_text_fails_as_out_of_memory_naming_it(
    wide_bert: Path,
) -> None:
    spec = replace(tiny_spec(wide_bert), max_seq_len=512, memory_share=8 << 20)
    with pytest.raises(OutOfMemory, match=r"the training share \(8 MiB, train_memory_share\)"):
        await asyncio.wait_for(train_in_child(spec, Events()), DEADLINE)


def _child_that_reports_its_frozen_objects(spec: TrainSpec, send: Any) -> None:
    """In a fork of this process: nothing frozen (as in the fork server), then the
    child's entry point, whose ``train`` says how many objects are frozen."""
    import gc

    gc.unfreeze()

    def frozen(spec: TrainSpec, report: Any, scratch: Path | None = None) -> TrainResult:
        report("status", {"frozen": gc.get_freeze_count()})
        raise RuntimeError("stopped after the report")

    child.train = frozen  # type: ignore[assignment]  # this fork's own copy
    child.child_main(spec, send)


def test_the_child_freezes_the_libraries_before_it_trains(spec: TrainSpec) -> None:
    """The run's memory watch collects garbage before each reading; with the libraries
    frozen, a collection walks only what the run made (0.26 s each over torch,
    transformers, peft, sentence-transformers and datasets otherwise)."""
    import torch  # noqa: F401  # what the fork server preloads, unfrozen in the fork

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_that_reports_its_frozen_objects, args=(spec, send))
    proc.start()
    send.close()
    try:
        assert receive.poll(DEADLINE)
        kind, event, data = receive.recv()
        assert (kind, event) == ("event", "status")
        assert data["frozen"] > 100_000, data  # torch alone is more
        assert receive.recv()[0] == "error"
    finally:
        proc.join(DEADLINE)
        if proc.is_alive():  # (a hung child fails the test, and is not left behind)
            proc.kill()
            proc.join()
    assert proc.exitcode == 1
