"""Children forked from a process that has already imported torch and transformers.

A fresh ``fleetserve worker`` spends about 3 CPU-seconds importing torch and
transformers before it loads anything (measured on a 2-core AMD EPYC, and on every
restart after a crash). The zygote (``zygote_main``) pays that once; each worker is
then a fork of it, ready to load its models at once.

``Zygote.spawn`` returns a ``ZygoteChild``, which answers as much of ``Popen`` as the
supervisor uses (``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``,
``kill``, ``returncode``). Where the zygote cannot serve a request it returns
``None`` and the caller starts a fresh interpreter:

- it has not started, or has ended;
- the child's environment differs from the zygote's in a variable the preloaded
  libraries may have read at import (only the ``free`` prefixes may differ:
  ``FLEETSERVE_*``, which only ``main()`` reads).

A process that has already imported everything the zygote preloads, runs one thread
and has the children's environment (a supervisor forked from another zygote, as the
tests' are) forks its zygote rather than starting an interpreter to import it all
again: 5 to 6 CPU-seconds less (2-core AMD EPYC). The fork keeps this process's open
descriptors, as ``multiprocessing``'s fork does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .natsd import die_with_parent
from .zygote_main import become

log = logging.getLogger("fleetserve.cluster")
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.bert.modeling_bert",  # the base of most small encoders
    "fleetserve.cli",
    "fleetserve.worker.process",
    "fleetserve.runtimes.torch",
    "fleetserve.families.dense",
    "fleetserve.queue.jetstream",
    "fleetserve.storage.offload",
)
READY_TIMEOUT = 120.0  # seconds for the zygote's imports
GONE_POLL = 0.05


def _threads() -> int:
    """This process's threads, the interpreter's and any library's own."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: the interpreter's only
        return threading.active_count()


class _ForkedZygote:
    """The zygote as a fork of this process: as much of ``Popen`` as ``close`` uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        pause = threading.Event()
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(["zygote"], timeout or 0.0)
            else:
                pause.wait(GONE_POLL)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether the process is there and not a zombie (whoever reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class ZygoteChild:
    """A forked child, as much of ``subprocess.Popen`` as a supervisor needs."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The zygote process and its socket; ``start`` returns at once (the imports run in
    the background), ``spawn`` waits for them."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        preload: Sequence[str] = PRELOAD,
        free: Sequence[str] = ("FLEETSERVE_",),
        quiet: bool = False,
    ) -> None:
        """``quiet``: the zygote's own stdin, stdout and stderr are /dev/null rather than
        this process's (its children's are whatever ``spawn`` passes)."""
        self.env = dict(env)
        self.quiet = quiet
        self.preload = list(preload)
        self.free = tuple(free)
        self.proc: subprocess.Popen[bytes] | _ForkedZygote | None = None
        self.sock: socket.socket | None = None
        self.loaded: list[str] = []
        self._ready = threading.Event()
        self._lock = threading.Lock()  # one request at a time, its pid reply with it
        self._sent = 0  # requests sent; each carries its number as ``id``
        self._replies: dict[int, dict[str, Any]] = {}
        self._abandoned: set[int] = set()  # requests whose reply came too late
        self._dead = False  # the zygote ended, or never became ready
        self._replied = threading.Condition()
        self._children: dict[int, ZygoteChild] = {}
        self._early: dict[int, int] = {}  # exits read before their spawn registered them
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [sys.executable, "-m", "fleetserve.cluster.zygote_main", str(theirs.fileno())]
        try:
            if self.forks():
                parent = os.getpid()
                sys.stdout.flush()  # (or what they hold is written twice)
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    ours.close()
                    become(theirs, self.preload, parent, self.quiet)
                self.proc = _ForkedZygote(pid)
            else:
                self.proc = subprocess.Popen(
                    [*cmd, *self.preload],
                    env=self.env,
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL if self.quiet else None,
                    stdout=subprocess.DEVNULL if self.quiet else None,
                    stderr=subprocess.DEVNULL if self.quiet else None,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
        finally:
            theirs.close()
        self.sock = ours
        self._reader = threading.Thread(target=self._read, name="zygote", daemon=True)
        self._reader.start()

    def forks(self) -> bool:
        """Whether ``start`` forks this process rather than starting an interpreter: it
        has imported every module the zygote preloads, under the environment the
        zygote's children get (a fork copies what the imports read), and runs one thread
        (a fork copies no other, nor any lock one holds)."""
        return (
            all(name in sys.modules for name in self.preload)
            and self.serves(dict(os.environ))
            and _threads() == 1
        )

    @property
    def alive(self) -> bool:
        return self.sock is not None and not self._dead

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a child with this environment may be forked from the zygote."""
        keys = (set(env) | set(self.env)) - {k for k in env if k.startswith(self.free)}
        keys -= {k for k in self.env if k.startswith(self.free)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def spawn(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str],
        *,
        session: bool = True,
        fds: tuple[int, int, int] = (0, 1, 2),
        cwd: str | None = None,
    ) -> ZygoteChild | None:
        """``python -m MODULE ARGS`` as a fork of the zygote, in ``cwd`` (None: this
        process's); ``None`` where it cannot."""
        if not self.serves(env) or not self._wait_ready() or not self.alive:
            return None
        sock = self.sock
        assert sock is not None
        with self._lock:
            self._sent += 1
            rid = self._sent
            request = {"id": rid, "module": module, "args": list(args), "env": dict(env)}
            request |= {"cwd": cwd or os.getcwd(), "session": session}
            try:
                socket.send_fds(sock, [json.dumps(request).encode()], list(fds))
            except OSError:
                return None
            with self._replied:
                if not self._replied.wait_for(lambda: rid in self._replies or self._dead, 30):
                    self._abandoned.add(rid)  # a late reply's child is killed, not left
                    log.warning("the workers' zygote did not answer in 30s; starting anew")
                    return None
                reply = self._replies.pop(rid, None)
                if reply is None or "error" in reply:
                    if reply is not None:
                        log.warning("the workers' zygote could not fork: %s", reply["error"])
                    return None
                child = ZygoteChild(int(reply["pid"]), [module, *args])
                self._children[child.pid] = child
                early = self._early.pop(child.pid, None)
                orphan = self._dead  # gone since its reply: nobody will report its exit
            if early is not None:
                child._exited(early)
            elif orphan:
                threading.Thread(target=self._bury, args=([child],), daemon=True).start()
            return child

    def _wait_ready(self) -> bool:
        """The zygote's imports done; after ``READY_TIMEOUT`` once, never again."""
        if not self._ready.wait(READY_TIMEOUT if not self._dead else 0):
            with self._replied:
                if not self._dead:
                    log.warning("the workers' zygote is not ready after %.0fs", READY_TIMEOUT)
                self._dead = True
            return False
        return True

    def _read(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    break
                self._handle(json.loads(data))
        except OSError:
            pass
        finally:
            self._gone()

    def _handle(self, msg: dict[str, Any]) -> None:
        if "ready" in msg:
            self.loaded = list(msg.get("loaded", []))
            self._ready.set()
            return
        with self._replied:
            if "exit" not in msg:  # a reply to a request
                rid = int(msg.get("id") or 0)  # 0: a request it could not read
                if rid in self._abandoned:
                    self._abandoned.discard(rid)
                    if "pid" in msg:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(msg["pid"]), signal.SIGKILL)
                    return
                self._replies[rid] = msg
                self._replied.notify_all()
                return
            pid, code = int(msg["exit"]), int(msg["code"])
            child = self._children.pop(pid, None)
            if child is None:
                self._early[pid] = code
        if child is not None:
            child._exited(code)

    def _gone(self) -> None:
        """The zygote ended: its children die with it (SIGTERM); each is marked exited
        once its process is gone."""
        self._ready.set()
        with self._replied:
            self._dead = True
            live = list(self._children.values())
            self._children.clear()
            self._replied.notify_all()
        self._bury(live)

    @staticmethod
    def _bury(children: list[ZygoteChild]) -> None:
        """Mark each exited once its process is gone (the zygote cannot tell: it is gone)."""
        pause = threading.Event()
        for child in children:
            while _running(child.pid) and not pause.wait(GONE_POLL):
                pass
            child._exited(-signal.SIGTERM)

    def close(self, timeout: float = 5.0) -> None:
        """End the zygote (its socket closes; its children, if any are left, die)."""
        if self.sock is not None:
            self.sock.shutdown(socket.SHUT_RDWR)
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
