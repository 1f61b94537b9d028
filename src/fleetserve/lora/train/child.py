"""Training in a child process, so that serving keeps its cores and its event loop.

:func:`train_in_child` spawns a fresh interpreter (``spawn``: no copy of the server's
threads, locks or torch thread pool), which lowers its own priority and runs
:func:`~.trainer.train`. Its events come back over a pipe as they happen, read by a
thread of the parent, and are handed to ``on_event`` on the event loop. Cancelling
(the ``cancel`` event, or cancelling the awaiting task) terminates the child; in every
path the child is joined before this returns, so none is left behind as a zombie.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ... import wire
from ...wire import Cancelled, FleetError
from .trainer import CheckpointMismatch, TrainResult, TrainSpec, train

OnEvent = Callable[[str, dict[str, Any]], None]
NICE = 10  # the child's niceness increment: serving goes first
GRACE = 5.0  # seconds a child has to exit (after its result, or after SIGTERM)
_END = ("result", "error", "eof")
_STOPPING: set[asyncio.Future[None]] = set()  # shutdowns under way (kept referenced)


async def train_in_child(
    spec: TrainSpec, on_event: OnEvent, cancel: asyncio.Event | None = None
) -> TrainResult:
    """:func:`~.trainer.train` in a child process. ``on_event(kind, data)`` gets the
    child's reports as they come. When ``cancel`` is set, the child is terminated
    (SIGTERM, SIGKILL after a grace period) and :class:`~fleetserve.wire.Cancelled`
    raised. A fleetserve error or :class:`~.trainer.CheckpointMismatch` raised in the
    child is raised again here as the same type; any other failure, or the child
    dying, is a ``RuntimeError`` saying what it was."""
    if cancel is not None and cancel.is_set():
        raise Cancelled("the training was cancelled")
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child_main, args=(spec, send), name="fleetserve-train", daemon=True)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    pump = threading.Thread(
        target=_pump, args=(receive, loop, queue), name="fleetserve-train-pipe", daemon=True
    )
    starting = asyncio.ensure_future(asyncio.to_thread(proc.start))
    finished = False
    try:
        await asyncio.shield(starting)
        send.close()  # the child's end: its exit is then our end-of-file
        pump.start()
        result = await _relay(queue, on_event, cancel, proc)
        finished = True
        return result
    finally:
        stop = asyncio.ensure_future(_shutdown(starting, proc, pump, receive, send, finished))
        _STOPPING.add(stop)
        stop.add_done_callback(_STOPPING.discard)
        await asyncio.shield(stop)  # cancelled again meanwhile: the child is still reaped


async def _shutdown(
    starting: asyncio.Future[None],
    proc: BaseProcess,
    pump: threading.Thread,
    receive: Connection,
    send: Connection,
    finished: bool,
) -> None:
    with contextlib.suppress(BaseException):
        await starting  # a start still under way would spawn a child after the stop
    send.close()
    await asyncio.to_thread(_stop, proc, pump, receive, finished)


async def _relay(
    queue: asyncio.Queue[tuple[Any, ...]],
    on_event: OnEvent,
    cancel: asyncio.Event | None,
    proc: BaseProcess,
) -> TrainResult:
    cancelled = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
    message: asyncio.Future[tuple[Any, ...]] | None = None
    try:
        while True:
            message = asyncio.ensure_future(queue.get())
            waits: set[asyncio.Future[Any]] = {message}
            if cancelled is not None:
                waits.add(cancelled)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if cancelled is not None and cancelled.done():
                message.cancel()
                raise Cancelled("the training was cancelled")
            kind, *rest = message.result()
            if kind == "event":
                on_event(rest[0], rest[1])
            elif kind == "result":
                result: TrainResult = rest[0]
                return result
            elif kind == "error":
                raise rebuild_error(rest[0])
            else:
                code = await asyncio.to_thread(_exit_code, proc)
                raise RuntimeError(f"the training process died without a result ({code})")
    finally:
        for waiting in (cancelled, message):
            if waiting is not None:
                waiting.cancel()


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


def _stop(proc: BaseProcess, pump: threading.Thread, receive: Connection, finished: bool) -> None:
    """Join the child: given a grace period to exit after its result, else terminated
    at once; SIGKILL if SIGTERM does not end it. Then the pipe's reader and end."""
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


# -- the child --------------------------------------------------------------------


def child_main(spec: TrainSpec, send: Connection) -> None:
    """The child's entry point: train and send events, then the result or the error."""
    os.nice(NICE)
    parent = os.getppid()
    _quiet()

    def report(kind: str, data: dict[str, Any]) -> None:
        if os.getppid() != parent:  # the server is gone: nobody will read the result
            os._exit(1)
        send.send(("event", kind, data))

    try:
        result = train(spec, report)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            send.send(("error", describe_error(exc)))
        send.close()
        sys.exit(1)
    send.send(("result", result))
    send.close()


def _quiet() -> None:
    """No progress bars, library warnings or info logs from the child on the server's
    terminal; nothing on stdout at all."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # also what C code would print
    os.close(null)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # for the child's lifetime
    warnings.simplefilter("ignore")
    try:
        datasets: Any = importlib.import_module("datasets")
        logs: Any = importlib.import_module("transformers.utils.logging")
    except ImportError:
        return  # train() says what is missing
    logs.set_verbosity_error()
    logs.disable_progress_bar()
    datasets.disable_progress_bars()


def describe_error(exc: BaseException) -> dict[str, Any]:
    """What crosses the pipe of an exception: its type's name, message and field."""
    message = exc.message if isinstance(exc, FleetError) else str(exc)
    return {
        "type": type(exc).__name__,
        "message": message,
        "field": getattr(exc, "field", None),
        "fleet": isinstance(exc, FleetError),
    }


def rebuild_error(d: dict[str, Any]) -> Exception:
    """The parent's side of :func:`describe_error`."""
    if d["type"] == CheckpointMismatch.__name__:
        return CheckpointMismatch(d["message"])
    kind = getattr(wire, d["type"], None) if d.get("fleet") else None
    if isinstance(kind, type) and issubclass(kind, FleetError):
        return kind(d["message"], field=d.get("field"))
    return RuntimeError(f"{d['type']}: {d['message']}" if d["message"] else d["type"])
