"""A device process of ``fleetserve worker --devices``: one Worker on one device.

Started by :class:`~fleetserve.worker.devices.DevicePool` as
``python -m fleetserve.worker.device_child --socket PATH --index I --device D --of N``
with the settings as ``FLEETSERVE_*`` pairs (JSON) on stdin. Its queue is a
``LocalQueueClient`` on the parent's socket; it announces itself once its models are
loaded, serves its own ``/healthz``, ``/readyz`` and ``/metrics`` on a free port, and
stops when its worker fails (exit 1, the parent restarts it) or the parent goes away.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from ..assembly import build_catalog, load_or_report
from ..lifecycle import HEALTH_GRACE_S, Service
from ..metrics import Metrics
from ..queue.local import LocalQueueClient
from ..settings import Settings
from ..stack import Stack, ack_waits, build_stack, build_worker, until_running
from ..tracing import open_tracer
from ..wire import FleetError
from .cores import core_share, usable_cores
from .health import HealthApp
from .loop import Worker

if TYPE_CHECKING:
    from nats.aio.client import Client

    from ..adapters_setup import Adapters, Hosting


class DeviceProcess(Service):
    """A Worker for one device, fed by the parent's local queue.

    Tasks: "http", and "worker" and "parent" (essential: the parent went away)."""

    def __init__(
        self, settings: Settings, path: str, index: int, device: str, console: Console
    ) -> None:
        super().__init__()
        self.settings = settings
        self.index = index
        self.device = device
        self.console = console
        self.metrics = Metrics()
        self.tracer = open_tracer(settings, "worker")  # the null one unless --tracing
        self.catalog = catalog = build_catalog(settings)
        self.adapters: Adapters | None = None
        self.hosting: Hosting | None = None  # the adapters' tiers, for hot-added runners too
        self._nats: Client | None = None
        self._models_nats: Client | None = None  # the fleet's models bucket
        self.stack = stack = build_stack(settings, catalog, self.metrics, console)
        self.profiles, self.choices = stack.profiles, stack.choices
        self.runners, self.fleet = stack.runners, stack.fleet
        self.queue = LocalQueueClient(path)
        self.queue.on_release = self._release_keep_alive  # a gateway's, via the parent
        self.worker: Worker | None = None
        self.port = 0

    def _release_keep_alive(self, model: str) -> float | None:
        """``model``'s keep-alive here ends; the seconds it had left (None: not served)."""
        return self.fleet.release_keep_alive(model) if model in self.runners else None

    def served_stack(self) -> Stack:
        """What serves the models (``hot_models.Served``)."""
        return self.stack

    def served_worker(self) -> Worker:
        if self.worker is None:
            raise RuntimeError("the worker is not built yet")
        return self.worker

    async def _watch_models(self) -> None:
        """The fleet's hot adds and removes (``queue.js_models``), over a NATS
        connection of this process's own: the parent pulls whatever models it asks for."""
        if not self.settings.nats:
            return
        from ..hot_models import HotModels
        from ..queue.js_models import SharedModels
        from ..queue.nats_conn import connect

        self._models_nats = nc = await connect(
            self.settings.nats,
            name=f"fleetserve-{self.device}-models",
            retry_for=self.settings.nats_connect_timeout,
        )
        hot = HotModels(self, self.settings, self.catalog, self.metrics, self.console, listing=list)
        hot.hosting = self.hosting.host if self.hosting is not None else None
        bucket = await SharedModels(nc.jetstream(), self.settings.queue_prefix).open()
        self.spawn("models-watch", bucket.watch(hot.put, hot.forget))

    @property
    def ready(self) -> bool:
        return self.worker is not None and self.worker.ready and self.queue.healthy

    def alive(self) -> bool:
        return (self.worker is None or self.worker.failed is None) and self.failed_stage() is None

    async def _host_adapters(self) -> None:
        """Adapters from the adapter store (the NATS object store by default, over a
        connection of this process's own), the warm tier in a directory of its own."""
        from ..adapters_setup import host_adapters, open_registry, prepare_hosts

        nats = None
        if self.settings.nats and not self.settings.adapter_store:
            from ..queue.nats_conn import connect

            nats = await connect(
                self.settings.nats,
                name=f"fleetserve-{self.device}-adapters",
                retry_for=self.settings.nats_connect_timeout,
            )
        self._nats = nats
        self.adapters = await open_registry(self.settings, self.catalog, nats=nats, declared=False)
        node = f"{self.settings.worker_id or socket.gethostname()}-{self.device}"
        registry = self.adapters.registry
        self.hosting = host_adapters(self.settings, registry, self.runners, self.fleet, node=node)
        await prepare_hosts(self.settings, self.runners)

    def _tune_in_background(self) -> None:
        """``--tune auto``: the devices of a host take turns to tune (``tune.hostlock``)
        within their own core share, step aside for any device's traffic, and adopt
        what a sibling tuned (the profile directory is the host's)."""
        from ..bench.tune.host import ServerHost, publish_load, tuning_class

        cls = tuning_class(self.settings, self.profiles)
        if cls is None:  # a neighbour's tune steps aside for its load all the same
            self.spawn("host-traffic", publish_load(self))
            return
        from ..bench.tune.background import BackgroundTuner

        env = dict(os.environ)  # (handed on to the tune child, as WorkerProcess does)
        tuner = BackgroundTuner(self.settings, self.catalog, ServerHost(self), cls, env)
        self.spawn("tuner", tuner.run())

    async def run(self) -> int:
        """Serve until the worker fails (1) or the parent goes away (0)."""
        app = HealthApp(self.metrics, alive=self.alive, ready=lambda: self.ready)
        self.port = await self.serve_http(
            app, self.settings.host, 0, essential=False, grace_s=HEALTH_GRACE_S
        )
        try:
            for r in self.runners.values():
                if not r.eager:  # loaded on its first request
                    continue
                await load_or_report(self.fleet, r, self.console)  # the fleet logs the load
            await self._host_adapters()
            await self.queue.start()
            waits = ack_waits(self.runners, self.settings).values()
            self.worker = build_worker(
                self.stack,
                self.queue,
                self.metrics,
                self.settings,
                self.tracer,
                keepalive=min(waits, default=5.0) / 3,
                shared_queue=True,  # the other devices take what it holds if it fails
                publisher=self.queue,  # the parts of a large request, to the others
            )
            task = self.spawn("worker", self.worker.run(), essential=True)
            await until_running(self.worker, task)
            await self._watch_models()
            self.queue.announce(
                {
                    "index": self.index,
                    "device": self.device,
                    "pid": os.getpid(),
                    "ready": self.ready,
                    "url": f"http://{self.settings.host}:{self.port}",
                }
            )
            self.spawn("parent", self.queue.lost.wait(), essential=True)
            self._tune_in_background()
            await self.wait()
            return 1 if self.worker.failed is not None or self.ended("worker") else 0
        finally:
            await self.stop_tasks()
            await self.queue.close()
            if self.adapters is not None:
                from ..adapters_setup import settle_hosts

                await settle_hosts(self.runners)
                await self.adapters.close()
            for nc in (self._nats, self._models_nats):
                if nc is not None:
                    await nc.close()
            if self.worker is not None:
                self.worker.close()
            self.tracer.shutdown()


async def _until_signal(proc: DeviceProcess) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await proc.run()
    except asyncio.CancelledError:
        return 0


def child_main(argv: list[str] | None = None) -> int:
    """A device process: settings as ``FLEETSERVE_*`` JSON on stdin."""
    p = argparse.ArgumentParser(prog="fleetserve-device")
    p.add_argument("--socket", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--of", type=int, default=1)
    args = p.parse_args(argv)
    console = Console(stderr=True)
    try:
        settings = Settings.load(env=json.loads(sys.stdin.read() or "{}"))
        from ..logs import setup_logging

        setup_logging(settings, tag=f"{settings.worker_id or 'worker'}/{args.device}")
        if args.device.split(":", 1)[0] == "cpu" and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, core_share(args.index, args.of, usable_cores()))
        sys.setswitchinterval(settings.gil_switch_interval)
        import uvloop

        proc = DeviceProcess(settings, args.socket, args.index, args.device, console)
        return int(uvloop.run(_until_signal(proc)))
    except (OSError, ValueError, RuntimeError, FleetError) as exc:
        console.print(f"[red]error:[/] device {args.device}: {escape(str(exc))}", highlight=False)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(child_main())
