from __future__ import annotations

# first: HOME becomes the run's own, before fleetserve expands ~ (tests/own_home.py)
from . import own_home

# isort: split
import asyncio
import atexit
import dataclasses
import logging
import multiprocessing.util
import os
import shutil
import tempfile
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetserve.bench.tune import hostlock
from fleetserve.catalog import Catalog
from fleetserve.cluster import NatsServer
from fleetserve.fleet import host_share
from fleetserve.logs import CHILD_ENV, LineHandler
from fleetserve.server import EmbeddedServer
from fleetserve.settings import Settings

from .tinymodels import build_bert, write_spec

TINY = "tiny/dense-bert"
REAL = "sentence-transformers/all-MiniLM-L6-v2"
# nothing lands in the developer's home; one TLS context for httpx.get and the like
pytest_plugins = ["tests.home_guard", "tests.shared_tls"]
# tests never read the developer's own tuned profiles (~/.config/fleetserve/profiles):
# a path under /dev/null cannot exist, so only the bundled profiles and rules apply
NO_USER_PROFILES = "/dev/null/fleetserve-profiles"
# the tiny test models run as the rules run them on a plain AVX2 machine (torch fp32),
# so that results equal transformers' exactly whatever CPU CI lands on
TINY_CLASS = "cpu-avx2"
# the servers the tests start do not tune in the background (--tune auto, the
# default) unless a test asks for it: a tune would take the cores from the test
os.environ.setdefault(Settings.env_name("tune"), "off")  # servers run as subprocesses
# the libraries' progress bars off here and in what the tests start, as in fleetserve's
# own children: a supervisor forked from the tests' zygote (tests/forked.py) then has its
# workers' environment, and forks its own zygote rather than importing torch again
os.environ.update(CHILD_ENV)
# what scikit-learn sets at its import (for Intel's OpenMP, which reads them at its
# load), set first: the environments the tests take before that import and after it
# are then one (tests/forked.py starts a zygote for each)
os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True")
os.environ.setdefault("KMP_INIT_AT_FORK", "FALSE")


@pytest.fixture(scope="session", autouse=True)
def _host_of_its_own(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One background tune per host, and one memory budget split between a host's
    processes: each test process is a host of its own, whatever else runs on the machine
    (a fleetserve serving there, another test session), and so is each xdist worker
    (with one lock for the run, a test's tune waited for the other worker's tunes: 72 s
    rather than 28 s). The host-wide files (the tune lock and its traffic file, the
    memory share) live in the temporary directory by default: this process takes one of
    its own, for the servers it runs itself (whose Settings read no environment), and
    points the servers it starts as subprocesses at the same files, whatever the
    environment said. Not through TMPDIR: a test's subprocesses would nest theirs below
    it, and a Unix socket's path grew too long. pytest's own temporary directory is
    found first, and multiprocessing's made (under the machine's), so that neither
    moves here. (xdist's groups, which could have kept the tuning tests on one worker,
    do not hold under pytest 9: xdist 3.8 renames the items' ``_nodeid``, which pytest 9
    no longer reads.)"""
    tmp_path_factory.getbasetemp()
    multiprocessing.util.get_temp_dir()
    tempfile.tempdir = tempfile.mkdtemp(prefix=f"fleetserve-tests-{os.getpid()}-")
    atexit.register(shutil.rmtree, tempfile.tempdir, True)
    os.environ[Settings.env_name("tune_lock")] = str(hostlock.default_path())
    os.environ[Settings.env_name("memory_share_dir")] = str(host_share.default_dir())


# what `make test-fast` leaves out: tests that start a server, a broker or a browser
# (through these fixtures, by living in these folders, or by starting a ServerThread,
# Services or EmbeddedServer themselves or through a helper or fixture of theirs),
# besides the slow ones
SERVICE_FIXTURES = frozenset(
    {"tiny_server", "real_server", "fleet_server", "nats_server", "dash_server",
     "keyed_dash_server"}
)  # fmt: skip
SERVICE_FOLDERS = ("cluster", "deploy", "dashboard", "benchmarks", "bench")
SERVICE_STARTERS = frozenset({"ServerThread", "Services", "EmbeddedServer"})


# the tests whose servers tune in the background: `make test` runs them in a pytest of
# its own, after the parallel run, two at a time, so that no tune (each held to its
# time budget) shares the cores with the rest of the suite (but for the tests that only
# compute, at nice 19: marker `soaks`)
BACKGROUND_TUNES = frozenset(
    f"bench/tune/{m}.py"
    for m in ("test_background", "test_fleetwide", "test_hosttraffic", "test_hostlock")
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(root).parts[0]
        names = set(item.fixturenames) if isinstance(item, pytest.Function) else set()
        if folder in SERVICE_FOLDERS or names & SERVICE_FIXTURES or _starts_services(item):
            item.add_marker(pytest.mark.services)
        if item.path.relative_to(root).as_posix() in BACKGROUND_TUNES:
            item.add_marker(pytest.mark.tunes)
        if _compiles_openvino(item):
            item.add_marker(pytest.mark.slow)


def _compiles_openvino(item: pytest.Item) -> bool:
    """A case run on OpenVINO compiles its model (seconds): slow, like a real model."""
    spec = (
        item.callspec if isinstance(item, pytest.Function) and hasattr(item, "callspec") else None
    )
    return spec is not None and "openvino" in spec.id.split("-")


def _starts_services(item: pytest.Item) -> bool:
    """Whether the test's code, or a function of the test modules that it or a fixture
    of it calls (kit.shared too), names a ServerThread, Services or EmbeddedServer: a
    test that starts one in its body has no fixture to tell."""
    if not isinstance(item, pytest.Function):
        return False
    todo = [(item.function.__code__, item.module.__dict__ if item.module else {})]
    for defs in item._fixtureinfo.name2fixturedefs.values():
        todo += [(d.func.__code__, d.func.__globals__) for d in defs if _ours(d.func)]
    seen: set[types.CodeType] = set()
    while todo:
        code, names = todo.pop()
        if code in seen:
            continue
        seen.add(code)
        if SERVICE_STARTERS & {*code.co_names, *code.co_varnames}:
            return True
        todo += [(c, names) for c in code.co_consts if isinstance(c, types.CodeType)]
        kits = [m for m in names.values() if isinstance(m, types.ModuleType) and _ours(m)]
        for name in code.co_names:
            for fn in (names.get(name), *(getattr(m, name, None) for m in kits)):
                if isinstance(fn, types.FunctionType) and _ours(fn):
                    todo.append((fn.__code__, fn.__globals__))
    return False


def _ours(obj: object) -> bool:
    """A function or module of the tests (not of a library)."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", "")
    return isinstance(name, str) and name.startswith("tests.")


class ServerThread:
    """A real fleetserve on loopback port 0, in a thread with its own event loop."""

    def __init__(
        self, settings: Settings, catalog: Catalog | None = None, *, background: bool = False
    ) -> None:
        """``background``: keep ``--tune auto`` (else it is off, as in every test server)."""
        if settings.tune == "auto" and not background:
            settings = dataclasses.replace(settings, tune="off")
        self.settings = settings
        self.catalog = catalog
        self.server: EmbeddedServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            from rich.console import Console

            self.server = EmbeddedServer(
                self.settings, catalog=self.catalog, console=Console(quiet=True)
            )
            await self.server.start()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await self.server.stop()

    def start(self) -> ServerThread:
        self._thread.start()
        self._started.wait(120)
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the server's loop and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(_as_coro(fn), self.loop).result(30)

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


async def _as_coro(fn: Any) -> Any:
    out = fn()
    if asyncio.iscoroutine(out):
        return await out
    return out


@pytest.fixture(scope="session")
def tiny_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    model = build_bert(root / "model")
    cat = root / "catalog"
    write_spec(cat, TINY, model)
    return cat


# the tiny models' exports, conversions, gate verdicts and adapter copies: a directory of
# this test process, not the user's ~/.cache/fleetserve (each run's new tiny models,
# with new mtimes, added entries there that nothing removed: 4.3 GB on this machine).
# In the run's home, which goes at the run's end whatever became of this process: in
# the machine's temporary directory one was left behind, empty, about two a clean-clone
# run: by a process that imported this module and ran no atexit (which one, not found)
TINY_CACHE = tempfile.mkdtemp(prefix="fleetserve-tests-cache-", dir=os.environ[own_home.VAR])
atexit.register(shutil.rmtree, TINY_CACHE, True)


@pytest.fixture(autouse=True)
def _root_logging() -> Iterator[None]:
    """A test that runs a command in-process (``cli.main`` sets up logging) leaves the
    root logger as it found it: the handler it added, on stderr, printed into later
    tests' captured output what the garbage collector logged then (asyncio's "Task was
    destroyed" of another test's client)."""
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    yield
    for h in list(root.handlers):
        if isinstance(h, LineHandler) and h not in before:
            root.removeHandler(h)
    root.setLevel(level)


def tiny_settings(catalog: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "port": 0,
        "cache_dir": TINY_CACHE,
        "catalog": str(catalog),
        "models": TINY,
        "device": "cpu",
        "torch_threads": 1,
        "profile_dir": NO_USER_PROFILES,
        "hardware_class": TINY_CLASS,
        "tune": "off",
    }
    base.update(overrides)
    return Settings.load(overrides=base)


@pytest.fixture(scope="module")
def tiny_server(tiny_catalog: Path) -> Iterator[ServerThread]:
    srv = ServerThread(tiny_settings(tiny_catalog)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    overrides = {
        "port": 0,
        "models": REAL,
        "device": "cpu",
        "profile_dir": NO_USER_PROFILES,
        # the README's adapters and fine-tuning jobs: not into the user's store
        "adapter_store": tmp_path_factory.mktemp("adapters").as_uri(),
    }
    srv = ServerThread(Settings.load(overrides=overrides)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def model_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fleetserve's cache_dir for tests: converted GGUF models and ONNX exports. In
    pytest's cache when there is one, so the ~20 s SmolLM2 conversion happens once."""
    cache = getattr(request.config, "cache", None)
    return Path(cache.mkdir("fleetserve-models")) if cache else tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def fleet_server(model_cache: Path) -> Iterator[ServerThread]:
    """The whole bundled catalog, as `make serve` runs it: the default model pinned, the
    others loaded on first use."""
    overrides = {
        "port": 0,
        "device": "cpu",
        "cache_dir": str(model_cache),
        "profile_dir": NO_USER_PROFILES,
    }
    srv = ServerThread(Settings.load(overrides=overrides)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """One real nats-server with JetStream for the session (port 0, temporary store).

    Tests keep apart by using their own stream and subject prefix.
    """
    with NatsServer() as srv:
        yield srv
