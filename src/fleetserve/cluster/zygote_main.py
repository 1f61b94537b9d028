"""The zygote process: import the heavy libraries once, then fork a child per request.

``python -m fleetserve.cluster.zygote_main FD MODULE...`` imports each MODULE it can
(a missing extra is skipped), says ``ready`` on the socket FD, and then serves it:

- a request (JSON: ``id``, ``module``, ``args``, ``env``, ``cwd``, ``session``, with
  the child's stdin, stdout and stderr passed as file descriptors) forks a child, and
  the reply is its ``pid`` (or an ``error`` where the fork failed), with the ``id``;
- each child's exit is reported as ``{"exit": pid, "code": returncode}`` (``-N`` for
  a signal, as ``subprocess`` says it);
- the socket's end (its client is gone) ends the zygote, and its children with it
  (each dies with its parent, as the cluster's children always did).

The zygote is single-threaded, so a fork copies a consistent process: the imports
are done, no thread pool has started (torch starts its pools at the first
operation), no logging is configured. The child sets its stdio, environment and
session, unwinds out of the serve loop and runs its module as ``python -m`` would,
so the interpreter ends it the ordinary way (atexit handlers, flushed streams).

What differs from a fresh interpreter: its command line (``/proc/PID/cmdline``, ``ps``)
is the zygote's, and ``sys.path[0]`` is the directory the zygote started in. The zygote
is one process all its children depend on: killed, it takes them with it (each dies
with its parent), and its client starts fresh interpreters from then on.

:func:`become` is the same zygote as a fork of a process that has already imported
what it preloads (``Zygote.start`` forks where it can), less the imports.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ..fleet.memory import freeze_imports
from .natsd import die_with_parent

MAX_REQUEST = 1 << 20  # bytes of one request (the environment is most of it)


@dataclass(frozen=True, slots=True)
class Request:
    module: str
    args: list[str]


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def preload(names: list[str]) -> list[str]:
    """Import what can be imported; the names that loaded."""
    loaded = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # an extra not installed, or a library that fails: forked without it
            continue
        loaded.append(name)
    # frozen out of the collector's walks: a child's collections skip them, and its
    # first one does not touch, and so copy, their pages
    freeze_imports()
    return loaded


def _code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"exit": pid, "code": _code(status)})


def _child(
    sock: socket.socket, wake: tuple[int, int], req: dict[str, Any], fds: list[int], zygote: int
) -> Request:
    """In the forked child: become the process the request describes."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sock.close()
    for fd in wake:
        os.close(fd)
    if req.get("session"):
        os.setsid()
    die_with_parent()
    if os.getppid() != zygote:  # the zygote died before the line above: so do we
        os.kill(os.getpid(), signal.SIGTERM)
    for target, fd in zip((0, 1, 2), fds, strict=True):
        if fd != target:
            os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    if "torch" in sys.modules:  # each fork draws its own random numbers (Python's
        sys.modules["torch"].seed()  # own are re-seeded at fork; torch's are not)
    return Request(req["module"], list(req["args"]))


def serve(sock: socket.socket, loaded: list[str]) -> Request:
    """Fork a child per request until the socket ends; returns only in a child."""
    if threading.active_count() != 1:  # a fork would copy a thread's held locks
        raise RuntimeError("the zygote must be single-threaded to fork")
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select through the pipe
    send(sock, {"ready": True, "loaded": loaded})
    while True:
        ready, _, _ = select.select([sock.fileno(), r], [], [])
        if r in ready:
            os.read(r, 4096)
            _reap(sock)
        if sock.fileno() not in ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 3)
        if not data:  # the client is gone
            raise SystemExit(0)
        sys.stdout.flush()
        sys.stderr.flush()
        zygote = os.getpid()
        try:  # a request that cannot be forked is refused: the zygote and its children stay
            req = json.loads(data)
            pid = os.fork()
        except (OSError, ValueError) as exc:
            pid, req = -1, {"id": None, "error": str(exc)}
        if pid == 0:
            return _child(sock, (r, w), req, fds, zygote)
        for fd in fds:
            os.close(fd)
        if pid < 0:
            send(sock, {"id": req.get("id"), "error": req["error"]})
        else:
            send(sock, {"id": req["id"], "pid": pid})


def _run(req: Request) -> None:
    """In a child: its module, as ``python -m`` runs it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [req.module, *req.args]
    runpy.run_module(req.module, run_name="__main__", alter_sys=True)


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the client, which stops us
    _run(serve(sock, preload(argv[1:])))


# what a fresh interpreter leaves at their defaults (SIGINT: ignored here, as in main)
_DEFAULT_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD")


def become(sock: socket.socket, names: Sequence[str], parent: int, quiet: bool) -> NoReturn:
    """In a fork of ``parent``: the zygote, as ``main`` is, on ``sock``. The fork holds
    its parent's imports, and a copy of its stack, which neither the zygote nor any of
    its children may unwind into: each ends here, with ``os._exit``, once it has done
    what an interpreter does at its end (joined its threads, run the exit handlers
    registered since the fork, flushed its streams)."""
    code, interrupted = 0, False
    try:
        os.setsid()
        die_with_parent()
        if os.getppid() != parent:  # the parent died before the line above: so do we
            raise SystemExit(0)
        if quiet:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.close(null)
        for name in _DEFAULT_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        atexit._clear()  # the parent's are the parent's
        atexit.register(logging.shutdown)
        _run(serve(sock, preload(list(names))))
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # as an interpreter would: the traceback, and exit 1
        traceback.print_exc()  # (or for a Ctrl-C, the end by SIGINT)
        code, interrupted = 1, isinstance(exc, KeyboardInterrupt)
    finally:
        try:
            threading._shutdown()  # type: ignore[attr-defined]  # (the interpreter's own)
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            if interrupted:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
        finally:
            os._exit(code)


def _exit_code(code: object) -> int:
    """``SystemExit.code`` as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main(sys.argv[1:])
