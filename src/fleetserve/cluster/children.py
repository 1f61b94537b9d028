"""The supervisor's children: how one starts (a ``fleetserve`` subprocess that dies
with its parent), how they stop, how a run's exit reads, and each child's restart
record with its back-off."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .natsd import die_with_parent
from .zygote import Zygote

BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 30.0  # seconds up after which a child's backoff starts over


class Proc(Protocol):
    """What the supervisor asks of a child: ``subprocess.Popen`` or a ``ZygoteChild``."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def spawn(
    args: list[str],
    env: Mapping[str, str],
    zygote: Zygote | None = None,
    *,
    module: str = "fleetserve",
    stdin: int | None = None,
) -> Proc:
    """``python -m MODULE ARGS`` (``fleetserve ARGS``) in a session of its own,
    SIGTERMed if this process dies: a fork of ``zygote`` where it serves this
    environment, else a fresh interpreter. ``stdin``: a descriptor for its stdin (None:
    this process's)."""
    if zygote is not None:
        child = zygote.spawn(module, args, env, fds=(0 if stdin is None else stdin, 1, 2))
        if child is not None:
            return child
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env=dict(env),
        stdin=stdin,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


def stop_all(procs: list[Proc], timeout: float = 10.0) -> None:
    """SIGTERM each, then wait up to ``timeout`` in all before SIGKILL."""
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
    end = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def describe_exit(code: int) -> str:
    """``-9`` -> ``-9, killed``; ``1`` -> ``1``."""
    if code >= 0:
        return str(code)
    try:
        name = signal.strsignal(-code) or signal.Signals(-code).name
    except ValueError:
        return str(code)
    return f"{code}, {name.lower()}"


@dataclass(slots=True)
class Backoff:
    """0.5 s doubling to 30 s; starts over after a child stayed up ``stable`` seconds."""

    start: float = BACKOFF_START
    cap: float = BACKOFF_MAX
    stable: float = STABLE_AFTER
    delay: float = 0.0  # the next wait; 0 until a first failure

    def next(self, uptime: float) -> float:
        if uptime >= self.stable or self.delay <= 0:
            self.delay = self.start
        else:
            self.delay = min(self.cap, self.delay * 2)
        return self.delay


@dataclass(slots=True)
class Child:
    """One supervised process: its current run, readiness and restart record."""

    name: str
    proc: Proc | None = None
    started: float = 0.0
    ready: bool = False  # this run became ready
    ever_ready: bool = False
    restarts: int = 0
    failures: int = 0  # runs in a row that ended before becoming ready
    due: float | None = None  # when a restart is scheduled
    url: str | None = None  # a worker's health URL as last seen ready
    backoff: Backoff = field(default_factory=Backoff)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


class GiveUp(Exception):
    """A child cannot start; the message is the one-line reason."""
