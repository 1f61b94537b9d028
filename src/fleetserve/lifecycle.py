"""How fleetserve's processes live: an HTTP server, named tasks, a start, a wait, a stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Coroutine
from typing import Any, Protocol

import uvicorn

from . import http_limits
from .settings import Settings

log = logging.getLogger("fleetserve.lifecycle")
STOP_PATIENCE_S = 5.0  # how long a cancelled task may take to end, at a process's stop
# the most a health port's requests in flight hold a worker's stop (uvicorn then cancels
# them): nothing there takes seconds, and a connection left open must not keep its
# device processes running (a SIGTERM'd devices worker outlived the test's 20 s twice)
HEALTH_GRACE_S = 3.0


async def start_http(
    app: Any, host: str, port: int, settings: Settings | None = None, grace_s: float | None = None
) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """Serve ``app`` with uvicorn (httptools) on ``host:port``; returns the bound port.

    Parsing and connections are bounded by ``settings``' HTTP limits (the defaults if
    None; see ``http_limits``); with all of them 0, by nothing (plain httptools). On
    stop, requests in flight finish first: for at most ``grace_s`` (None: however
    long they take; then uvicorn cancels them and says so in one line)."""
    limits = settings or Settings()
    http: str | type[asyncio.Protocol] = "httptools"  # uvicorn's name, or a class
    if http_limits.enabled(limits):
        http = http_limits.protocol_class(limits, limits.retry_after)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=http,
        lifespan="off",
        access_log=False,  # the gateway writes its own access lines (fleetserve.access)
        log_level="warning",
        log_config=None,  # its loggers go through ours (fleetserve.logs), one style
    )
    config.timeout_keep_alive = limits.http_keepalive_timeout  # type: ignore[assignment]
    config.timeout_graceful_shutdown = grace_s  # type: ignore[assignment]
    sock = _bind(host, port)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve([sock]), name="http")
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the HTTP server stopped during start-up")
        await asyncio.sleep(0.01)
    return server, task, int(sock.getsockname()[1])


async def shutdown(http: uvicorn.Server | None, tasks: list[asyncio.Task[object]]) -> None:
    """Stop the HTTP server (``tasks[0]``) gracefully, its requests in flight answered
    meanwhile, then cancel the other tasks (as ``Service.stop_tasks`` does with
    ``serve_http(http_first=True)``)."""
    if http is not None:
        http.should_exit = True
    for k, t in enumerate(tasks):
        if k:
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


def _bind(host: str, port: int) -> socket.socket:
    """Bind here rather than in uvicorn, so a taken port is a clear error, not an exit
    (and one out of range too, not an ``OverflowError``'s traceback)."""
    if not 0 <= port <= 65535:
        raise RuntimeError(f"cannot listen on {host}:{port}: a port is 0 to 65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted sockets inherit it; asyncio sets it only on sockets made with proto TCP,
    # and without it each reply on a kept-alive connection waits ~40 ms (Nagle + ACK)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


class Service:
    """A process's named tasks: some essential (their end ends the process), the
    others in the background; and the one HTTP server, stopped gracefully."""

    settings: Settings  # each process sets its own before it serves

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[object]] = {}
        self.essential: set[str] = set()
        self._http: uvicorn.Server | None = None
        self._http_first = False  # its requests are answered by the other tasks

    async def serve_http(
        self,
        app: object,
        host: str,
        port: int,
        *,
        essential: bool = True,
        grace_s: float | None = None,
        http_first: bool = False,
    ) -> int:
        """Start the HTTP server as the task "http"; returns the bound port. Its HTTP
        limits are those of the process's ``settings`` (every Service has them);
        ``grace_s``: how long its requests in flight may hold its stop (``start_http``);
        ``http_first``: the other tasks answer them (``stop_tasks``)."""
        self._claim("http", essential)
        self._http_first = http_first
        self._http, self.tasks["http"], bound = await start_http(
            app, host, port, self.settings, grace_s
        )
        return bound

    def spawn(
        self, name: str, coro: Coroutine[Any, Any, Any], *, essential: bool = False
    ) -> asyncio.Task[object]:
        """Run ``coro`` as the task ``name`` (one name, one task)."""
        try:
            self._claim(name, essential)
        except ValueError:
            coro.close()
            raise
        task = self.tasks[name] = asyncio.create_task(coro, name=name)
        return task

    def _claim(self, name: str, essential: bool) -> None:
        if name in self.tasks:
            raise ValueError(f"a task named {name!r} is already running")
        if essential:
            self.essential.add(name)

    def ended(self, name: str) -> bool:
        """Whether the task ``name`` was started and has ended."""
        task = self.tasks.get(name)
        return task is not None and task.done()

    async def wait(self) -> None:
        """Until the first essential task ends (none: at once); what it raised, raised."""
        tasks = [t for n, t in self.tasks.items() if n in self.essential]
        if tasks:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()

    def failed_stage(self) -> str | None:
        """The first task that raised, or essential one that ended; None if none did."""
        for name, t in self.tasks.items():
            if not t.done() or t.cancelled():
                continue
            if t.exception() is not None or name in self.essential:
                return name
        return None

    async def stop_tasks(self, patience_s: float = STOP_PATIENCE_S) -> None:
        """Stop the HTTP server gracefully (its requests in flight finish, within its
        ``grace_s``), cancel the other tasks, await them all: each of those for at most
        ``patience_s``, then the stop goes on without it, and one warning names it (a
        task that ignores its cancel must not keep a process's children and queues
        from stopping). Where the HTTP server's requests are answered by the other
        tasks (``serve_http(http_first=True)``: an embedded server's worker, a gateway's
        queue), those are cancelled only once it has stopped; before, an embedded
        server's worker was cancelled at once under a request in flight, which waited
        out its deadline (a 504 after 30 s) and held the stop. A worker's health port
        is not such: its worker stops pulling at once."""
        if self._http is not None:
            self._http.should_exit = True
        http = self.tasks.get("http")
        if http is not None and self._http_first:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await http
        for name, t in self.tasks.items():
            if name != "http":
                t.cancel()
        for name, t in self.tasks.items():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await (t if name == "http" else asyncio.wait_for(asyncio.shield(t), patience_s))
            if not t.done():
                log.warning("the %s task did not stop within %g s; stopping without it",
                            name, patience_s)  # fmt: skip


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
