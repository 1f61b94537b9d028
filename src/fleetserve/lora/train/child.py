"""Training in a child process, so that serving keeps its cores and its event loop.

:func:`train_in_child` starts a child from a fork server (multiprocessing's
``forkserver``: a process of its own, started at the first job, that has imported
torch, transformers, PEFT and sentence-transformers once and holds none of the
server's threads, locks or torch thread pool). The child lowers its own priority and
runs :func:`~.trainer.train` at once: a fresh interpreter (``spawn``) spent about 5
CPU-seconds importing those libraries for every job. Its events come back over a
pipe as they happen, read by a thread of the parent, and are handed to ``on_event``
on the event loop. Cancelling (the ``cancel`` event, or cancelling the awaiting task)
terminates the child; in every path the child is joined before this returns, so none
is left behind as a zombie, except a ``cancel`` while the child is still starting:
that returns at once, and the child is stopped and joined once it has started. The
fork server stays for the next job (about 540 MB resident with those libraries, on a
2-core AMD EPYC) and ends with the server.

With a ``memory_limit``, the child caps its own data segment (``RLIMIT_DATA``: the
private memory it maps, touched or not, heap and anonymous mmaps alike, the imported
libraries' included) before it trains, so a job that outgrows it fails its own
allocations instead of swelling until the kernel's out-of-memory killer picks a
process (maybe the server). A child that runs out of memory (a ``MemoryError``,
torch's "can't allocate memory", a library that cannot map) or is killed by SIGKILL,
as that killer does, raises :class:`OutOfMemory` here, which says so and names the
limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import ModuleType
from typing import Any

from ...fleet.memory import freeze_imports
from ...wire import Cancelled
from .errors import OutOfMemory, describe_error, is_out_of_memory, limit_text, rebuild_error
from .rerank import train_reranker
from .spec import RERANK, TrainResult, TrainSpec
from .trainer import train

OnEvent = Callable[[str, dict[str, Any]], None]
# what the fork server imports before it forks a child (one that is not installed is
# left out there, and train() says what is missing): this module, and through it
# fleetserve's own, too
PRELOAD = ("torch", "transformers", "peft", "sentence_transformers", "datasets", __name__)
NICE = 10  # the child's niceness increment: serving goes first
EXIT_NO_MEMORY = 3  # the child's exit status when it ran out of memory
GRACE = 5.0  # seconds a child has to exit (after its result, or after SIGTERM)
LOOK_EVERY = 0.1  # seconds between looks at the child's memory while it is quiet
NEAR = 0.8  # a child that dies at this fraction of its memory limit ran out of it
_END = ("result", "error", "eof")
_STOPPING: set[asyncio.Future[None]] = set()  # shutdowns under way (kept referenced)


async def train_in_child(
    spec: TrainSpec,
    on_event: OnEvent,
    cancel: asyncio.Event | None = None,
    *,
    memory_limit: int = 0,
) -> TrainResult:
    """:func:`~.trainer.train` in a child process. ``on_event(kind, data)`` gets the
    child's reports as they come. When ``cancel`` is set, the child is terminated
    (SIGTERM, SIGKILL after a grace period) and :class:`~fleetserve.wire.Cancelled`
    raised. A fleetserve error or :class:`~.checkpoint.CheckpointMismatch` raised in the
    child is raised again here as the same type; any other failure, or the child
    dying, is a ``RuntimeError`` saying what it was; running out of memory (over
    ``memory_limit`` bytes, 0: none) is :class:`OutOfMemory`."""
    if cancel is not None and cancel.is_set():
        raise Cancelled("the training was cancelled")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # (read when the fork server starts)
    receive, send = ctx.Pipe(duplex=False)
    # the trainer's output directory is ours: removed once the child is joined, however
    # it ended (a child terminated or killed runs no cleanup of its own)
    scratch = tempfile.mkdtemp(prefix="fleetserve-train-")
    proc = ctx.Process(
        target=child_main, args=(spec, send, memory_limit, scratch), name="fleetserve-train",
        daemon=True,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    pump = threading.Thread(
        target=_pump, args=(receive, loop, queue), name="fleetserve-train-pipe", daemon=True
    )
    started = asyncio.Event()
    failed: list[BaseException] = []  # the start's error, if it failed
    starter = threading.Thread(
        target=_start, args=(proc, send, loop, started, failed), name="fleetserve-train-start",
        daemon=True,
    )  # fmt: skip
    starter.start()
    finished = early = False
    try:
        early = await _cancelled_first(started, cancel)
        if early:
            raise Cancelled("the training was cancelled")
        if failed:
            raise failed[0]
        pump.start()
        result = await _relay(queue, on_event, cancel, proc, memory_limit)
        finished = True
        return result
    finally:
        stop = asyncio.ensure_future(
            asyncio.to_thread(_stop, starter, proc, pump, receive, finished, scratch)
        )
        _STOPPING.add(stop)
        stop.add_done_callback(_STOPPING.discard)
        if not early:  # (early: the child is stopped and joined once it has started)
            await asyncio.shield(stop)  # cancelled again meanwhile: the child is still reaped


def _start(
    proc: BaseProcess,
    send: Connection,
    loop: asyncio.AbstractEventLoop,
    started: asyncio.Event,
    failed: list[BaseException],
) -> None:
    """Start the child (the first job waits for the fork server's imports), then close
    our copy of its pipe end: only once the start has handed it over, since a fork
    server sent a closed descriptor exits (Python 3.11), failing every start under way."""
    try:
        proc.start()
    except BaseException as exc:
        failed.append(exc)
    finally:
        send.close()  # the child's end: its exit is then our end-of-file
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(started.set)


async def _cancelled_first(started: asyncio.Event, cancel: asyncio.Event | None) -> bool:
    """Wait for the child's start; True if ``cancel`` was set first. The first job's
    start waits for the fork server's imports (seconds), which a cancel does not."""
    if cancel is None:
        await started.wait()
        return False
    waits = {asyncio.ensure_future(started.wait()), asyncio.ensure_future(cancel.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return not started.is_set()


async def _relay(
    queue: asyncio.Queue[tuple[object, ...]],
    on_event: OnEvent,
    cancel: asyncio.Event | None,
    proc: BaseProcess,
    memory_limit: int = 0,
) -> TrainResult:
    cancelled = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
    message: asyncio.Future[tuple[Any, ...]] | None = None
    used = 0  # the child's data segment (bytes) when last looked at
    try:
        while True:
            if message is None:
                message = asyncio.ensure_future(queue.get())
            waits: set[asyncio.Future[Any]] = {message}
            if cancelled is not None:
                waits.add(cancelled)
            await asyncio.wait(waits, timeout=LOOK_EVERY, return_when=asyncio.FIRST_COMPLETED)
            if cancelled is not None and cancelled.done():
                raise Cancelled("the training was cancelled")
            used = data_bytes(proc.pid) or used
            if not message.done():
                continue
            kind, *rest = message.result()
            message = None
            if kind == "event":
                on_event(rest[0], rest[1])
            elif kind == "result":
                result: TrainResult = rest[0]
                return result
            elif kind == "error":
                error = rebuild_error(rest[0], memory_limit)
                if type(error) is RuntimeError and memory_limit > 0 and used >= NEAR * memory_limit:
                    # what a library raises when its allocations start failing varies
                    said = rest[0]["message"] or rest[0]["type"]
                    raise OutOfMemory(f"the training process ran out of memory "
                                      f"({limit_text(memory_limit)}; {used / memory_limit:.0%} "
                                      f"in use): {said}")  # fmt: skip
                raise error
            else:
                raise _died(await asyncio.to_thread(_exit_code, proc), memory_limit, used)
    finally:
        for waiting in (cancelled, message):
            if waiting is not None:
                waiting.cancel()


def _died(code: str, memory_limit: int, used: int) -> RuntimeError:
    """The error of a child that died without a result (``code``, as :func:`_exit_code`
    says it), which last used ``used`` bytes of data segment."""
    said = f"the training process died without a result ({code})"
    if code == f"exit code {EXIT_NO_MEMORY}":  # it said so, if not over the pipe
        return OutOfMemory(f"the training process ran out of memory ({limit_text(memory_limit)})")
    if code == "killed by SIGKILL":  # not by us: we kill only after this returns
        return OutOfMemory(f"{said}, as the kernel's out-of-memory killer does: it most likely "
                           f"ran out of memory ({limit_text(memory_limit)})")  # fmt: skip
    if memory_limit > 0 and used >= NEAR * memory_limit:  # a library that exits (OpenBLAS)
        return OutOfMemory(f"{said} with {used / memory_limit:.0%} of its memory in use: it "
                           f"ran out of memory ({limit_text(memory_limit)})")  # fmt: skip
    return RuntimeError(said)


def data_bytes(pid: int | None) -> int:
    """A live process's data segment (VmData, what RLIMIT_DATA counts), 0 if unknown."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _pump(receive: Connection, loop: asyncio.AbstractEventLoop, queue: Any) -> None:
    """Forward each message from the child to ``queue`` until its last one."""
    while True:
        try:
            message = receive.recv()
        except (EOFError, OSError):
            message = ("eof",)
        try:
            loop.call_soon_threadsafe(queue.put_nowait, message)
        except RuntimeError:  # the loop is closed: nobody is listening
            return
        if message[0] in _END:
            return


def _exit_code(proc: BaseProcess) -> str:
    proc.join(GRACE)
    code = proc.exitcode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _stop(
    starter: threading.Thread,
    proc: BaseProcess,
    pump: threading.Thread,
    receive: Connection,
    finished: bool,
    scratch: str,
) -> None:
    """Once the start is over, join the child: given a grace period to exit after its
    result, else terminated at once; SIGKILL if SIGTERM does not end it. Then the
    pipe's reader and end, and the child's scratch directory."""
    starter.join()  # (a start under way would start a child after the stop)
    if proc.pid is not None:  # started
        if finished:
            proc.join(GRACE)
        if proc.is_alive():
            proc.terminate()
            proc.join(GRACE)
        if proc.is_alive():
            proc.kill()
        proc.join()
    if pump.is_alive():
        pump.join(GRACE)
    receive.close()
    proc.close()
    shutil.rmtree(scratch, ignore_errors=True)


# -- the child --------------------------------------------------------------------


def child_main(
    spec: TrainSpec, send: Connection, memory_limit: int = 0, scratch: str | None = None
) -> None:
    """The child's entry point: cap its memory, train and send events, then the result
    or the error."""
    if memory_limit > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = memory_limit if hard == resource.RLIM_INFINITY else min(memory_limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    os.nice(NICE)
    parent = os.getppid()

    def report(kind: str, data: dict[str, object]) -> None:
        if os.getppid() != parent:  # the server is gone: nobody will read the result
            os._exit(1)
        send.send(("event", kind, data))

    try:
        _quiet()  # imports libraries: under a memory limit, that can fail too
        # the libraries' objects out of every later collection: the run's memory watch
        # collects before each of its readings (share.py), and a full collection over
        # torch, transformers, peft, sentence-transformers and datasets walked 500,000
        # objects (0.26 s each, on a 2-core AMD EPYC)
        freeze_imports()
        run = train_reranker if spec.kind == RERANK else train
        result = run(spec, report, Path(scratch) if scratch else None)
    except BaseException as exc:
        with contextlib.suppress(Exception):  # no memory left even to say so: the exit code
            send.send(("error", describe_error(exc)))
        send.close()
        sys.exit(EXIT_NO_MEMORY if is_out_of_memory(exc) else 1)
    send.send(("result", result))
    send.close()


def _quiet() -> None:
    """No progress bars, library warnings or info logs from the child on the server's
    terminal; nothing on stdout at all."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # also what C code would print
    os.close(null)
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115  # for the child's lifetime
    warnings.simplefilter("ignore")
    try:
        datasets: ModuleType = importlib.import_module("datasets")
        logs: ModuleType = importlib.import_module("transformers.utils.logging")
    except ImportError:
        return  # train() says what is missing
    logs.set_verbosity_error()
    logs.disable_progress_bar()
    datasets.disable_progress_bars()
