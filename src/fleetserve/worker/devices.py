"""``fleetserve worker --devices a,b``: one puller per machine, one process per device.

The parent (:class:`DevicePool`) holds the one upstream WorkQueue (JetStream) and a
:class:`~fleetserve.queue.local.LocalQueueServer` on a Unix socket; it loads no
model. Each device gets a child process (``device_child.py``) with a normal Worker,
its models built for that device, and a ``LocalQueueClient`` as its queue. Settings
reach the child as ``FLEETSERVE_*`` pairs (JSON) on its stdin, so no secret shows on
a command line.

- A child that exits (a crash, ``kill -9``) loses its socket: what it held goes to
  the other devices at once, attempts + 1. It is restarted with backoff.
- Children die with the parent (``PR_SET_PDEATHSIG``), and a child whose parent goes
  away stops; upstream then redelivers after ``ack_wait``.
- ``cpu:N`` devices share the cores: each child gets its slice (CPU affinity) and
  ``torch_threads`` of cores / devices unless set. ``cuda:N`` is used as given.
- The parent serves ``/healthz``, ``/readyz`` (upstream connected and at least one
  device ready) and ``/metrics``; each child serves its own on a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge
from rich.console import Console

from ..assembly import build_catalog, build_profiles
from ..catalog import Catalog, ModelSpec
from ..cluster.children import Proc, spawn
from ..cluster.presence import announce_forever
from ..cluster.zygote import Zygote
from ..fleet.memory import budget_limit, parse_size
from ..lifecycle import HEALTH_GRACE_S, Service, run_process
from ..metrics import Metrics
from ..queue.factory import open_distributed, watch_broker
from ..queue.js_models import SharedModels
from ..queue.js_release import serve_releases
from ..queue.local import LocalQueueServer
from ..settings import Settings
from ..stack import ack_wait_for
from ..wire.heartbeat import DeviceBeat, Heartbeat, ModelBeat
from .cores import runtime_device, usable_cores
from .health import HealthApp

if TYPE_CHECKING:
    from ..queue import JetStreamQueue

log = logging.getLogger("fleetserve.devices")
MAX_BACKOFF = 30.0
CHILD = "fleetserve.worker.device_child"


def child_settings(settings: Settings, device: str, n: int) -> Settings:
    """One device process's settings: its share of the cores and, on CPU, where the
    devices share the host's memory, its share of a set memory budget (on the default
    budget each registers in the host's share, ``fleet.host_share``, as every fleetserve
    process there does)."""
    threads = settings.torch_threads or max(1, len(usable_cores()) // n)
    budget = settings.memory_budget
    if device.startswith("cpu") and n > 1 and budget:
        budget = str(parse_size(budget, limit=budget_limit("cpu")) // n)
    return dataclasses.replace(
        settings,
        device=runtime_device(device),
        devices="",
        worker_port=0,
        torch_threads=threads,
        memory_budget=budget,
    )


@dataclass(eq=False)
class _Child:
    index: int
    device: str
    proc: Proc | None = None
    failures: int = 0  # exits since it was last ready
    restart_at: float | None = None


class DevicePool(Service):
    """The parent: upstream queue, local queue server, and one child per device.

    Tasks: "http" and "supervise" (essential), "heartbeat" and "metrics"."""

    def __init__(
        self, settings: Settings, catalog: Catalog | None = None, console: Console | None = None
    ) -> None:
        super().__init__()
        self.settings = settings
        self.devices = settings.device_list()
        self.catalog = catalog if catalog is not None else build_catalog(settings)
        self.console = console or Console(stderr=True)
        self.node = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        device = runtime_device(self.devices[0])
        self._profiles = profiles = build_profiles(dataclasses.replace(settings, device=device))
        # the models the heartbeat lists: the catalog's, then the fleet's hot adds
        self.profiles = {s.id: profiles.choose(s).profile for s in self.catalog}
        self.metrics = Metrics()
        self.restarts = Counter(
            "fleetserve_device_restarts",
            "Device processes restarted after they exited.",
            ["device"],
            registry=self.metrics.registry,
        )
        self.children = [_Child(i, d) for i, d in enumerate(self.devices)]
        held = Gauge(
            "fleetserve_device_in_flight",
            "Requests each device process holds now.",
            ["device"],
            registry=self.metrics.registry,
        )
        for c in self.children:
            held.labels(c.device).set_function(functools.partial(self._holding, c.index))
        self.server: LocalQueueServer | None = None
        self.js: JetStreamQueue | None = None
        self.port = 0
        self._dir = ""
        self._announced = False
        # the device processes are forks of one that imported torch already (their
        # environment is this process's; the settings go through stdin, as always)
        self.zygote = Zygote(dict(os.environ)) if settings.fork_workers else None

    # -- state ----------------------------------------------------------------------
    def _live(self) -> list[dict[str, Any]]:
        return self.server.clients if self.server is not None else []

    def _holding(self, index: int) -> int:
        held = self.server.holding() if self.server is not None else []
        return sum(n for info, n in held if info.get("index") == index)

    @property
    def ready(self) -> bool:
        up = bool(self.js is not None and self.js.healthy)
        return up and any(info.get("ready") for info in self._live())

    def alive(self) -> bool:
        return self.failed_stage() is None  # the supervisor, above all

    def describe(self) -> Heartbeat:
        live = {info.get("index"): info for info in self._live()}
        devices = []
        for c in self.children:
            info = live.get(c.index, {})
            devices.append(
                DeviceBeat(
                    device=c.device,
                    pid=c.proc.pid if c.proc is not None else None,
                    ready=bool(info.get("ready")),
                    url=info.get("url"),
                )
            )
        any_ready = any(d.ready for d in devices)
        return Heartbeat(
            id=self.node,
            pid=os.getpid(),
            host=socket.gethostname(),
            ready=self.ready,
            url=f"http://{self.settings.host}:{self.port}",
            device=",".join(self.devices),
            devices=devices,
            models={
                m: ModelBeat(loaded=any_ready, precision=p.precision, hardware=p.hardware)
                for m, p in self.profiles.items()
            },
        )

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        if self.zygote is not None:  # its imports run while the queues open
            self.zygote.start()
        app = HealthApp(self.metrics, alive=self.alive, ready=lambda: self.ready)
        self.port = await self.serve_http(
            app, self.settings.host, self.settings.worker_port, grace_s=HEALTH_GRACE_S
        )
        waits = {m: ack_wait_for(p, self.settings) for m, p in self.profiles.items()}
        js, queue, _ = await open_distributed(self.settings, self.node, waits)
        self.js = js
        watch_broker(js, self.metrics)
        self._dir = tempfile.mkdtemp(prefix="fleetserve-devices-")
        self.server = LocalQueueServer(
            queue,
            os.path.join(self._dir, "queue.sock"),
            touch_every=min(waits.values(), default=5.0) / 3,
            max_deliver=self.settings.max_deliver,
            age_limit=self.settings.batch_age_limit,
            on_hello=self._on_hello,
            on_lost=self._on_lost,
        )
        await self.server.start()
        # an admin's keep-alive releases
        await serve_releases(js.connection(), self.settings.queue_prefix, self._release_keep_alive)
        log.info(
            "worker %s: local queue on %s; starting %d device processes (%s)",
            self.node, self.server.path, len(self.children), ", ".join(self.devices),
        )  # fmt: skip
        for c in self.children:  # a thread: the first fork waits for the zygote's imports
            await asyncio.to_thread(self._spawn, c)
        self.spawn("supervise", self._supervise(), essential=True)
        beat = announce_forever(js.connection(), self.settings.queue_prefix, self.describe)
        self.spawn("heartbeat", beat)
        bucket = await SharedModels(js.context(), self.settings.queue_prefix).open()
        self.spawn("models-watch", bucket.watch(self._model_added, self._model_removed))
        self.spawn("metrics", self._refresh_metrics())

    async def _model_added(self, model: str, fields: dict[str, object]) -> None:
        """A model the fleet added (its device processes serve it: they watch the
        bucket too): the heartbeat lists it, with the profile a child chooses."""
        spec = ModelSpec.from_dict({**fields, "id": model})
        self.profiles[model] = self._profiles.choose(spec).profile

    async def _model_removed(self, model: str) -> None:
        self.profiles.pop(model, None)

    def _spawn(self, c: _Child) -> None:
        assert self.server is not None
        c.restart_at = None
        args = ["--socket", self.server.path, "--index", str(c.index), "--device", c.device]
        args += ["--of", str(len(self.children))]
        stdin, feed = os.pipe()
        try:
            c.proc = spawn(args, dict(os.environ), self.zygote, module=CHILD, stdin=stdin)
        except OSError as exc:
            os.close(feed)
            c.failures += 1
            c.restart_at = time.monotonic() + min(MAX_BACKOFF, 0.5 * 2**c.failures)
            log.error("could not start the process for device %s: %s", c.device, exc)
            return
        finally:
            os.close(stdin)
        env = child_settings(self.settings, c.device, len(self.children)).to_env()
        with contextlib.suppress(OSError), open(feed, "wb") as f:  # died at once: supervise sees it
            f.write(json.dumps(env).encode())

    async def _release_keep_alive(self, model: str) -> float | None:
        """A gateway's release, passed to every device process: the most seconds any had
        left (0 when none answered in time: the gateway counts this host among the
        model's holders, and must not wait for an answer that never comes)."""
        if model not in self.profiles or self.server is None:
            return None
        from ..queue.js_release import WAIT

        left = await self.server.release(model, timeout=WAIT / 2)
        return 0.0 if left is None else left

    def _on_hello(self, info: dict[str, Any]) -> None:
        index = info.get("index")
        if not isinstance(index, int) or not 0 <= index < len(self.children):
            return
        c = self.children[index]
        if not info.get("ready"):
            return
        c.failures = 0
        pid, url = info.get("pid"), info.get("url")
        log.info("device %s ready: pid %s, health on %s", c.device, pid, url)
        if not self._announced:
            self._announced = True
            log.info(
                "worker %s ready: %d models, devices %s; health on :%d",
                self.node, len(self.profiles), ",".join(self.devices), self.port,
            )  # fmt: skip

    def _on_lost(self, info: dict[str, Any], held: int) -> None:
        log.warning(
            "device %s went away holding %d request(s); they go to the other devices",
            info.get("device", "?"),
            held,
        )

    async def _supervise(self) -> None:
        """Restart children that exit: at once after a crash, backing off if they keep dying."""
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for c in self.children:
                if c.proc is not None and c.proc.poll() is not None:
                    code, pid = c.proc.returncode, c.proc.pid
                    c.proc = None
                    c.failures += 1
                    delay = min(MAX_BACKOFF, 0.5 * 2 ** (c.failures - 1))
                    c.restart_at = now + delay
                    self.restarts.labels(c.device).inc()
                    log.warning(
                        "device %s (pid %s) exited with %s; restarting in %.1fs",
                        c.device, pid, code, delay,
                    )  # fmt: skip
                if c.proc is None and c.restart_at is not None and now >= c.restart_at:
                    await asyncio.to_thread(self._spawn, c)

    async def _refresh_metrics(self) -> None:
        assert self.server is not None
        server, m = self.server, self.metrics
        models = list(self.profiles)
        while True:
            with contextlib.suppress(Exception):
                await server.upstream.refresh(models)
            up, here = server.upstream.stats, server.stats
            for model in models:
                m.queue_depth.labels(model).set(server.depth(model))
                m.put_backs.labels(model).set(up.put_backs.get(model, 0))
                redelivered = up.redeliveries.get(model, 0) + here.redeliveries.get(model, 0)
                m.redeliveries.labels(model).set(redelivered)
                m.dead_letters.labels(model).set(up.dead_letters.get(model, 0))
            m.worker_up.set(1 if self.ready else 0)
            await asyncio.sleep(1.0)

    async def stop(self) -> None:
        await self.stop_tasks()  # no restarts from here on
        await self._stop_children()
        if self.zygote is not None:
            await asyncio.to_thread(self.zygote.close)
        if self.server is not None:
            await self.server.close()  # what is left goes back upstream
        if self.js is not None:
            await self.js.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _stop_children(self, timeout: float = 10.0) -> None:
        procs = [c.proc for c in self.children if c.proc is not None]
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


async def run_devices(settings: Settings) -> None:
    await run_process(DevicePool(settings), settings)
