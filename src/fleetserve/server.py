"""The embedded default: gateway, in-process queue and one worker in one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import uvicorn
from rich.console import Console

from .catalog import Catalog, ModelSpec
from .catalog.fetch import ObjectStoreConfig
from .catalog.hardware import detect
from .catalog.profiles import Choice, Profiles
from .catalog.rules import missing_extra
from .catalog.sources import is_present, resolve
from .families import FamilyAdapter, create_adapter
from .gateway import Gateway
from .metrics import Metrics
from .queue import MemoryQueue
from .runtimes import create_runtime
from .settings import Settings
from .tune.quick import wanted as quick_wanted
from .wire import FleetError
from .worker import ModelRunner, Worker
from .worker.runner import Runner

log = logging.getLogger("fleetserve")
HF_CACHE = Path("~/.cache/huggingface/hub").expanduser()  # Settings.hf_cache's default


def build_catalog(settings: Settings) -> Catalog:
    extra = [Path(settings.catalog)] if settings.catalog else []
    catalog = Catalog.load(extra)
    wanted = settings.model_list()
    return catalog.restrict(wanted) if wanted else catalog


def build_profiles(settings: Settings) -> Profiles:
    """This machine's profiles: its hardware class (or the one asked for), the tuned
    files for it (yours, then bundled), its fallbacks. A broken file is a ValueError
    naming the file and the field."""
    device = "cpu" if settings.device.startswith("cpu") else settings.device
    return Profiles(detect(device), settings.hardware_class, Path(settings.profile_dir))


def weights_path(spec: ModelSpec, settings: Settings) -> Path:
    """Where ``spec``'s weights are on this machine: fetched or converted once if need
    be; a ``ModelNotFound`` listing every place looked in if they are nowhere."""
    return resolve(
        spec.id,
        spec.sources,
        Path(settings.hf_cache).expanduser(),
        cache_dir=Path(settings.cache_dir).expanduser(),
        objects=ObjectStoreConfig(
            settings.s3_endpoint,
            settings.s3_region,
            settings.s3_access_key_id,
            settings.s3_secret_access_key,
        ),
    )


def build_runner(
    spec: ModelSpec, settings: Settings, metrics: Metrics, choice: Choice | None = None
) -> Runner:
    """A runner for ``spec``. Nothing is resolved or loaded here: the weights are found
    and loaded on first use (at start for pinned models and those named in --models).
    A profile chosen by rules is held to the quality gate when it loads."""
    choice = choice or build_profiles(settings).choose(spec)
    profile = choice.profile

    def make_adapter(
        precision: str = profile.precision, runtime: str = profile.runtime or spec.runtime
    ) -> FamilyAdapter:
        path = weights_path(spec, settings)
        engine = create_runtime(
            runtime,
            device=settings.device,
            precision=precision,
            threads=settings.torch_threads or profile.threads,
            cache_dir=Path(settings.cache_dir).expanduser(),
            options=spec.runtime_options,
        )
        return create_adapter(spec, engine, path)

    def make_reference() -> FamilyAdapter:  # fp32 torch, or this runtime where it is absent
        return make_adapter("fp32", "torch" if not missing_extra("torch") else runtime_name)

    runtime_name = profile.runtime or spec.runtime
    verify = None
    if choice.how == "rule" and profile.precision != "fp32" and spec.runtime != "external":
        from .tune.gate import gate_at_load

        verify = gate_at_load(spec, profile.precision, make_reference)
    eager = spec.pinned or spec.id in settings.model_list()
    if spec.family == "generate":
        from .worker.gen_runner import GenerationRunner

        return GenerationRunner(
            spec,
            profile,
            make_adapter,
            metrics,
            settings.max_batch_tokens,
            eager=eager,
            verify=verify,
        )
    return ModelRunner(
        spec,
        profile,
        make_adapter,
        metrics,
        settings.max_batch_tokens,
        eager=eager,
        verify=verify,
    )


def log_choices(choices: dict[str, Choice], catalog: Catalog, console: Console) -> None:
    """One line per model at start: what it runs with, and why (``GET /v1/models`` has
    the whole reason); one more line if some run on rules, saying how to tune them."""
    ruled = 0
    for spec in catalog:
        c = choices[spec.id]
        p = c.profile
        why = c.reason.split("; `fleetserve tune", 1)[0]
        ruled += c.how in ("rule", "fallback")
        procs = (
            f"; its profile asks for {p.processes} processes per device, which "
            "`fleetserve worker` runs (this process is one)"
            if p.processes > 1
            else ""
        )
        console.print(
            f"  {spec.id}: {p.runtime or spec.runtime} {p.precision}, batch "
            f"{p.max_batch_size}/{p.max_batch_tokens} [dim]({why}{procs})[/]",
            highlight=False,
        )
    if ruled:
        console.print(
            f"  [dim]{ruled} model(s) run on rules or a fallback, not tuned for this class: "
            "`fleetserve tune MODEL` (or serve --tune quick) tunes them[/]",
            highlight=False,
        )


class EmbeddedServer:
    """Everything in one event loop: uvicorn, the gateway, the queue and a worker."""

    def __init__(
        self, settings: Settings, catalog: Catalog | None = None, console: Console | None = None
    ) -> None:
        self.settings = settings
        self.catalog = catalog if catalog is not None else build_catalog(settings)
        self.console = console or Console(stderr=True)
        self.metrics = Metrics()
        self.queue = MemoryQueue(settings.max_queue_depth, settings.retry_after)
        self.profiles = build_profiles(settings)
        self.choices = {s.id: self.profiles.choose(s) for s in self.catalog}
        self.runners = {
            s.id: build_runner(s, settings, self.metrics, self.choices[s.id]) for s in self.catalog
        }
        self.tuning = quick_wanted(settings, self.catalog, self.choices)  # --tune quick
        self.worker = self._new_worker()
        self.gateway = Gateway(
            settings,
            self.catalog,
            self.queue,
            self.metrics,
            ready=lambda: self.worker.ready and not self.tuning,
            models_info=self.models_info,
        )
        self._server: uvicorn.Server | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.port = 0

    def models_info(self) -> list[dict[str, Any]]:
        out = []
        hf_cache = Path(self.settings.hf_cache).expanduser()
        for spec in self.catalog:
            r = self.runners[spec.id]
            out.append(
                {
                    "id": spec.id,
                    "object": "model",
                    "owned_by": "fleetserve",
                    "family": spec.family,
                    "runtime": r.profile.runtime or spec.runtime,
                    "precision": r.profile.precision,
                    "hardware": r.profile.hardware,
                    "profile": self.choices[spec.id].describe(),
                    "loaded": r.loaded,
                    "present": is_present(
                        spec.sources, hf_cache, Path(self.settings.cache_dir).expanduser()
                    ),
                    "tasks": sorted(t.value for t in r.tasks),
                    "dimensions": getattr(r.adapter_or_none, "dim", None) or spec.dimensions,
                    "max_seq_len": spec.max_seq_len,
                }
            )
        return out

    async def start(self) -> None:
        self._server, task, self.port = await start_http(
            self.gateway, self.settings.host, self.settings.port
        )
        self._tasks.append(task)
        self.console.print(
            f"[bold green]fleetserve[/] API listening on http://{self.settings.host}:{self.port}"
        )
        self.console.print(f"hardware: {self.profiles.hw.summary()}", highlight=False)
        log_choices(self.choices, self.catalog, self.console)
        if self.tuning:
            await self._quick_tune()
        await self._load_models()
        await self.queue.start()
        self._tasks.append(asyncio.create_task(self.worker.run(), name="worker"))
        while not self.worker.running and not self._tasks[-1].done():
            await asyncio.sleep(0.001)
        self.console.print(f"[bold green]fleetserve[/] ready: {len(self.runners)} model(s)")

    def _new_worker(self) -> Worker:
        return Worker(self.queue, self.runners, self.metrics, max_deliver=self.settings.max_deliver)

    async def _quick_tune(self) -> None:
        """Tune the untuned pinned models briefly, then serve them with what won."""
        from .tune.quick import quick_tune

        tuned = await quick_tune(
            self.settings, self.catalog, self.profiles, self.tuning, self.console
        )
        if tuned:
            self.profiles = build_profiles(self.settings)
            for model in tuned:
                spec = self.catalog.get(model)
                self.choices[model] = self.profiles.choose(spec)
                self.runners[model] = build_runner(
                    spec, self.settings, self.metrics, self.choices[model]
                )
            self.worker.close()  # never ran: only its CPU thread to release
            self.worker = self._new_worker()
            log_choices(
                {m: self.choices[m] for m in tuned}, self.catalog.restrict(tuned), self.console
            )
        self.tuning = []

    async def _load_models(self) -> None:
        """The eager models now; the others on first use."""
        for spec in self.catalog:
            r = self.runners[spec.id]
            if not r.eager:
                continue
            t0 = time.perf_counter()
            with self.console.status(
                f"Loading {spec.id} ({r.profile.runtime or spec.runtime}, "
                f"{r.profile.precision}, {r.profile.hardware})…"
            ):
                if not await load_or_report(r, self.console):
                    continue
            self.console.print(
                f"  loaded {spec.id} in {time.perf_counter() - t0:.1f}s "
                f"({r.adapter.memory_bytes() / 2**20:.0f} MiB)"
            )

    async def wait(self) -> None:
        """Until the HTTP server stops (Ctrl-C or ``stop``)."""
        if self._tasks:
            await self._tasks[0]

    async def stop(self) -> None:
        self.gateway.dashboard.close()  # end open event streams, or uvicorn waits for them
        await shutdown(self._server, self._tasks)
        await self.queue.close()
        self.worker.close()


async def load_or_report(runner: Runner, console: Console) -> bool:
    """Load a pinned model at start. One that fails (weights absent, an extra not
    installed) is reported and left to load on first use: the others still serve."""
    try:
        await runner.load()
    except Exception as exc:
        message = exc.message if isinstance(exc, FleetError) else f"{type(exc).__name__}: {exc}"
        console.print(
            f"[red]error:[/] {runner.spec.id} failed to load: {message}; serving the other "
            "models, and its requests will try again",
            highlight=False,
        )
        runner.eager = False  # not required for readiness any more
        return False
    return True


async def start_http(
    app: Any, host: str, port: int
) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """Serve ``app`` with uvicorn (httptools) on ``host:port``; returns the bound port."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    sock = _bind(host, port)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve([sock]), name="http")
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the HTTP server stopped during start-up")
        await asyncio.sleep(0.01)
    return server, task, int(sock.getsockname()[1])


async def shutdown(http: uvicorn.Server | None, tasks: list[asyncio.Task[Any]]) -> None:
    """Stop the HTTP server (``tasks[0]``) gracefully and cancel the other tasks."""
    if http is not None:
        http.should_exit = True
    for t in tasks[1:]:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


def _bind(host: str, port: int) -> socket.socket:
    """Bind here rather than in uvicorn, so a taken port is a clear error, not an exit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


class Process(Protocol):
    async def start(self) -> None: ...

    async def wait(self) -> None: ...

    async def stop(self) -> None: ...


async def run_process(proc: Process, settings: Settings) -> None:
    """Start ``proc``, wait until it ends or is cancelled, then stop it to the end.

    uvicorn re-raises the SIGTERM it caught, which may cancel us again while stopping:
    the stop is shielded so that its clean-up always completes.
    """
    sys.setswitchinterval(settings.gil_switch_interval)
    try:
        await proc.start()
        await proc.wait()
    finally:
        stopping = asyncio.ensure_future(proc.stop())
        while not stopping.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(stopping)
        stopping.result()


async def serve(settings: Settings) -> None:
    await run_process(EmbeddedServer(settings), settings)
