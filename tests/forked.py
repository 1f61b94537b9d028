"""Python children for tests, forked from an interpreter that has imported torch.

A fresh ``python -m fleetserve serve`` spends 5.5 to 8.5 CPU-seconds importing torch and
transformers before it serves (2-core AMD EPYC, cpu-avx2); a fork of an interpreter
that has imported them, 0.45. The suite starts a few dozen such children. A test
process forks them from zygotes (the product's, ``fleetserve.cluster.zygote``, which
the cluster forks its workers from), one for each environment that the preloaded
libraries or the interpreter's start may read (``IMPORT_ENV``: the hub's, torch's, the
thread pools', Python's own), started with that environment the second time a child
asks for it (the first runs fresh: a zygote costs a fresh start's imports), at most
``MAX_ZYGOTES`` of them. Anything else in a child's environment (``FLEETSERVE_*``,
``HOME``, ``PATH``, ``COLUMNS``) is read at run time, from the environment it is given.
A child is a fresh interpreter, as before, where no zygote serves it.

``popen`` and ``run`` take what ``subprocess.Popen`` and ``subprocess.run`` take, for
``[sys.executable, "-m", MODULE, *ARGS]`` or ``[sys.executable, "-c", CODE, *ARGS]``.
What differs from a fresh interpreter is what ``cluster/zygote_main.py`` says: the
command line (``ps``) is the zygote's, and the child is the zygote's child, not this
process's (``os.waitpid`` cannot reap it; ``wait`` and ``poll`` here can). Not for a
test about what a fresh interpreter imports or how it starts (tests/test_core_install.py,
the ``*_without_torch`` tests, tracing's "never imported"): those use ``subprocess``.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from fleetserve.cluster.natsd import die_with_parent
from fleetserve.cluster.zygote import PRELOAD, Zygote, ZygoteChild

# also imported before the fork: what `fleetserve serve` builds
PRELOAD_TESTS = (*PRELOAD, "fleetserve.server", "fleetserve.stack")
# variables that a preloaded library (or the interpreter's start) may read before main():
# each set of their values has a zygote of its own
IMPORT_ENV = (
    "HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA", "NVIDIA_",
    "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TOKENIZERS_", "TQDM_", "XDG_",
    "LD_", "MALLOC_", "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONSAFEPATH",
    "PYTHONWARNINGS", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONSTARTUP",
)  # fmt: skip
# ... but for these, which libraries set at run time and read where they use them:
# torch's, and tokenizers' (set by transformers' generation, datasets and gliner as they
# run, so that a test process's environment gained it midway: the environments taken
# before and after were two zygotes' in 22 and 24 children of one run)
READ_LATER = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TOKENIZERS_PARALLELISM"})
CODE = "tests.forked_code"  # runs a ``-c`` program as the interpreter would
# TESTS_FRESH_CHILDREN=1: every child a fresh interpreter (does a failure need the fork?)
FRESH = os.environ.get("TESTS_FRESH_CHILDREN") == "1"

MAX_ZYGOTES = 3  # in one process (each holds ~0.5 GB, shared with its children)

_lock = threading.Lock()
_zygotes: dict[tuple[tuple[str, str], ...], Zygote] = {}
_asked: dict[tuple[tuple[str, str], ...], int] = {}


def read_at_import(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_ENV) and k not in READ_LATER)
    )


class _TestZygote(Zygote):
    def serves(self, env: Mapping[str, str]) -> bool:
        return read_at_import(env) == read_at_import(self.env)


def _zygote_for(env: Mapping[str, str], *, now: bool = False) -> Zygote | None:
    """The zygote for this environment; None for the first child that asks unless
    ``now`` (or past ``MAX_ZYGOTES``): it runs fresh."""
    key = read_at_import(env)
    with _lock:
        if key not in _zygotes:
            _asked[key] = _asked.get(key, 0) + 1
            if (_asked[key] < 2 and not now) or len(_zygotes) >= MAX_ZYGOTES:
                return None
            z = _zygotes[key] = _TestZygote(dict(env), preload=PRELOAD_TESTS, quiet=True)
            z.start()
            atexit.register(z.close)
        return _zygotes[key]


def zygote_for(env: Mapping[str, str]) -> Zygote | None:
    """The zygote for children of this environment that fleetserve starts itself (a
    cluster's workers, tests/cluster/conftest.py), started now if it is not yet: the
    one this process's own children of that environment fork from. None where every
    child is fresh (``TESTS_FRESH_CHILDREN=1``, or past ``MAX_ZYGOTES``)."""
    return None if FRESH else _zygote_for(env, now=True)


class Forked:
    """A forked child, as much of ``subprocess.Popen`` as the tests use."""

    def __init__(
        self,
        child: ZygoteChild,
        args: list[str],
        streams: tuple[IO[Any] | None, IO[Any] | None, IO[Any] | None],
    ) -> None:
        self._child = child
        self.pid = child.pid
        self.args = args
        self.stdin, self.stdout, self.stderr = streams
        self._read: dict[str, Any] = {}
        self._readers: list[threading.Thread] = []

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._child.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self._child.send_signal(sig)

    def terminate(self) -> None:
        self._child.terminate()

    def kill(self) -> None:
        self._child.kill()

    def communicate(
        self, input: str | bytes | None = None, timeout: float | None = None
    ) -> tuple[Any, Any]:
        if not self._readers:  # first call: feed stdin, read both pipes to their ends
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                if stream is not None:
                    t = threading.Thread(target=self._drain, args=(name, stream), daemon=True)
                    t.start()
                    self._readers.append(t)
        for t in self._readers:
            t.join(timeout)
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.wait(timeout)
        return self._read.get("stdout"), self._read.get("stderr")

    def _drain(self, name: str, stream: IO[Any]) -> None:
        self._read[name] = stream.read()
        stream.close()

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        self.wait()


def _end(spec: Any, which: int, text: bool, close: list[int]) -> tuple[int, IO[Any] | None]:
    """The child's descriptor for one of its stdio, and our end of it where it is a pipe."""
    if spec is None:
        return which, None
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        close.append(fd)
        return fd, None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        ours, theirs = (w, r) if which == 0 else (r, w)
        close.append(theirs)
        mode = ("w" if which == 0 else "r") + ("" if text else "b")
        stream = open(ours, mode, encoding="utf-8" if text else None)  # noqa: SIM115
        return theirs, stream
    if isinstance(spec, int):
        return spec, None
    return spec.fileno(), None


def popen(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool = False,
    start_new_session: bool = False,
    preexec_fn: Callable[[], object] | None = None,
) -> Forked | subprocess.Popen[Any]:
    """``subprocess.Popen(argv, ...)``, forked from the zygote where it serves.
    ``preexec_fn``: only ``die_with_parent`` is forked (a fork dies with the zygote,
    which dies with this process); any other runs in a fresh interpreter's child."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    python = len(argv) >= 3 and argv[0] == sys.executable and argv[1] in ("-m", "-c")
    if python and not FRESH and preexec_fn in (None, die_with_parent):
        module, args = (argv[2], argv[3:]) if argv[1] == "-m" else (CODE, argv[2:])
        forked = _fork(module, args, argv, env, cwd, (stdin, stdout, stderr), text,
                       start_new_session)  # fmt: skip
        if forked is not None:
            return forked
    return subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text,
        start_new_session=start_new_session, preexec_fn=preexec_fn,
    )  # fmt: skip


def _fork(
    module: str,
    args: list[str],
    argv: list[str],
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None,
    stdio: tuple[Any, Any, Any],
    text: bool,
    session: bool,
) -> Forked | None:
    zygote = _zygote_for(env)
    if zygote is None:
        return None
    close: list[int] = []  # the child's ends: the zygote has them once it has forked
    streams: list[IO[Any] | None] = []
    fds: list[int] = []
    try:
        for which, spec in enumerate(stdio):
            if which == 2 and spec == subprocess.STDOUT:
                fds.append(fds[1])
                streams.append(None)
                continue
            fd, stream = _end(spec, which, text, close)
            fds.append(fd)
            streams.append(stream)
        child = zygote.spawn(
            module, args, env, session=session, fds=(fds[0], fds[1], fds[2]),
            cwd=None if cwd is None else os.fspath(cwd),
        )  # fmt: skip
    finally:
        for fd in close:
            os.close(fd)
    if child is None:
        for s in streams:
            if s is not None:
                s.close()
        return None
    return Forked(child, argv, (streams[0], streams[1], streams[2]))


def run(
    argv: Sequence[str],
    *,
    input: str | bytes | None = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    text: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(argv, ...)``, forked from the zygote where it serves."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    stdin = subprocess.PIPE if input is not None else None
    proc = popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text)
    with proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    code = proc.returncode
    assert code is not None
    done = subprocess.CompletedProcess(list(argv), code, out, err)
    if check:
        done.check_returncode()
    return done
