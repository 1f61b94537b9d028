"""``fleetserve cluster --workers N``: the distributed mode on one machine.

It starts a local nats-server with JetStream (a free port, a temporary store unless
``--store-dir`` is given), one gateway and N workers, all as child processes that
get the same settings through ``FLEETSERVE_*`` variables. It prints where each
listens and each child's pid (``worker-0 pid 1234``).

It supervises them: a child that dies is restarted alone, with backoff, while the
others keep serving; each exit and restart is one line (``worker-1 exited (-9,
killed); restarting in 0.5s (restart 1)``). NATS comes back on the same port with the
same store, so clients reconnect and file-stored work survives. Only Ctrl-C (or
SIGTERM) stops everything: workers and gateway first, then NATS, exit 0.

Restart policy (``Backoff``): the first restart waits 0.5 s, each further one twice as
long up to 30 s; a child that stays up ``STABLE_AFTER`` seconds starts again from
0.5 s. A child that keeps failing before it ever becomes ready (bad settings, a port
taken) gives up the cluster after ``GIVE_UP_AFTER`` failures in a row: the gateway or
nats-server alone, the workers when every one of them fails so (exit 1, one line).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping

import httpx
from rich.console import Console
from rich.markup import escape

from ..logs import child_env
from ..logs.access import PROBE_HEADER
from ..settings import Settings
from ..wire import Unavailable
from .children import STABLE_AFTER, Child, GiveUp, Proc, describe_exit, spawn, stop_all
from .natsd import NatsServer
from .zygote import Zygote

log = logging.getLogger("fleetserve.cluster")
_PROBE = {PROBE_HEADER: "cluster"}  # its polling's access lines at debug level
HEAL_FREE_BYTES = 8 * 1024 * 1024  # free space on the store that lets nats-server write again
HEAL_EVERY = 30.0  # seconds between two restarts of nats-server for a write error
GIVE_UP_AFTER = 5  # failures in a row before ever becoming ready


class Cluster:
    def __init__(
        self,
        settings: Settings,
        workers: int,
        env: Mapping[str, str],
        *,
        store_dir: str | None = None,
        console: Console | None = None,
        zygote: Zygote | None = None,
    ) -> None:
        """``zygote``: the workers' zygote (``cluster.zygote``) to fork them from, kept
        open at ``stop``; without one, the cluster starts its own where the
        ``fork_workers`` setting asks for it, and ends it at ``stop``."""
        if workers < 1:
            raise ValueError("--workers must be at least 1")
        self.settings = settings
        self.n = workers
        self.base_env = dict(env)
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.nats = NatsServer(store_dir=store_dir)
        self.gateway: Proc | None = None
        self.workers: list[Proc] = []
        self.nats_child = Child("nats-server")
        self.gateway_child = Child("gateway")
        self.worker_children = [Child(f"worker-{i}") for i in range(workers)]
        self.api = f"http://{settings.host}:{settings.port}"
        # the probes of its own gateway: one client (a new one per probe read the CA
        # bundle each time, 20 ms of CPU every 0.1 s while the workers load), and no
        # connection kept between probes (so nothing to close: a stopped cluster can start
        # again)
        self.http = httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))
        self._healed = -HEAL_EVERY  # when nats-server was last restarted for a write error
        self.zygote = zygote
        self._own_zygote: Zygote | None = None

    def child_env(self, **extra: str) -> dict[str, str]:
        env = child_env({**self.base_env, **self.settings.to_env()})  # no library bars
        env[Settings.env_name("nats")] = self.nats.url
        if not self.settings.torch_threads:  # share the cores between the workers
            env[Settings.env_name("torch_threads")] = str(max(1, (os.cpu_count() or 1) // self.n))
        # and the host's memory: on the default budget, each worker registers in the
        # host's share (fleet.host_share), with every other fleetserve process there
        env.update({Settings.env_name(k): v for k, v in extra.items()})
        return env

    # -- starting each kind of child ------------------------------------------------
    def _start_nats(self) -> None:
        c = self.nats_child
        self.nats.start()
        c.proc, c.started, c.ready = self.nats.proc, time.monotonic(), True
        c.ever_ready, c.failures = True, 0

    def _start_gateway(self) -> None:
        c = self.gateway_child
        self.gateway = c.proc = spawn(["gateway"], self.child_env())
        c.started, c.ready = time.monotonic(), False

    def _start_worker(self, i: int) -> None:
        c = self.worker_children[i]
        wenv = self.child_env(worker_id=c.name, worker_port="0")
        c.proc = spawn(["worker"], wenv, self.zygote)
        c.started, c.ready = time.monotonic(), False
        if i < len(self.workers):
            self.workers[i] = c.proc
        else:
            self.workers.append(c.proc)

    def _starter(self, c: Child) -> Callable[[], None]:
        if c is self.nats_child:
            return self._start_nats
        if c is self.gateway_child:
            return self._start_gateway
        i = self.worker_children.index(c)
        return lambda: self._start_worker(i)

    def start(self) -> str:
        if self.zygote is None and self.settings.fork_workers:  # its imports run meanwhile
            self.zygote = self._own_zygote = Zygote(self.child_env())
            self.zygote.start()
        self._start_nats()
        log.info("nats-server (JetStream) on %s, store %s", self.nats.url, self.nats.store_dir)
        log.info("nats-server pid %s", self.nats.pid)
        self._start_gateway()
        log.info("gateway pid %s", self.gateway_child.pid)
        for i, c in enumerate(self.worker_children):
            self._start_worker(i)
            log.info("%s pid %s", c.name, c.pid)
        return self.api

    def wait_ready(self, api: str, timeout: float = 300.0) -> bool:
        """Until the gateway is ready and every worker shows up in /v1/models.

        Without supervision: False as soon as a child exits.
        """
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(p.poll() is not None for p in self.children):
                return False
            try:
                r = self.http.get(api + "/v1/models", timeout=2)
                live = {w["id"] for m in r.json()["data"] for w in m["workers"] if w["ready"]}
                if len(live) >= self.n:
                    return True
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.25)
        return False

    @property
    def children(self) -> list[Proc]:
        return [*self.workers, *([self.gateway] if self.gateway else [])]

    @property
    def supervised(self) -> list[Child]:
        return [self.nats_child, self.gateway_child, *self.worker_children]

    # -- supervision ----------------------------------------------------------------
    @property
    def all_ready(self) -> bool:
        return all(c.ready for c in self.supervised)

    def supervise(self) -> None:
        """One round: notice exits, schedule and make restarts, track readiness.

        Raises ``GiveUp`` when a child keeps failing before it ever becomes ready.
        """
        now = time.monotonic()
        if self.nats_child.due is None:  # its NatsServer knows the run (restarted in place)
            self.nats_child.proc = self.nats.proc
        for c in self.supervised:
            if c.proc is not None and c.due is None and (code := c.proc.poll()) is not None:
                self._exited(c, code, now)
        self._check_ready()
        self._heal_broker(now)
        for c in self.supervised:
            if c.due is not None and time.monotonic() >= c.due:
                self._restart(c)

    def _heal_broker(self, now: float) -> None:
        """nats-server whose store failed a write (a full disk) refuses writes to that
        stream until it reopens it, even once space is free again: restart it then, on
        the same port and store, so the fleet serves again with nothing restarted by
        hand (the workers and the gateway ride the reconnect; the stored work stays)."""
        c = self.nats_child
        if c.proc is None or c.due is not None or c.proc.poll() is not None:
            return
        if now - self._healed < HEAL_EVERY or not self.nats.write_failed():
            return
        free = shutil.disk_usage(self.nats.store_dir).free
        if free < HEAL_FREE_BYTES:
            return  # still full: the gateway and workers say so (queue storage full)
        self._healed = now
        log.warning(
            "nats-server's store failed a write and has %d MiB free again: restarting "
            "nats-server to reopen it",
            free // (1024 * 1024),
        )
        try:
            self.nats.restart()
        except Unavailable as err:
            log.warning("nats-server did not restart (%s); retrying", err)
            c.proc, c.ready = None, False
            c.due = time.monotonic() + c.backoff.next(0.0)
            return
        c.proc, c.started, c.restarts = self.nats.proc, time.monotonic(), c.restarts + 1
        log.info("%s pid %s", c.name, c.pid)

    def _exited(self, c: Child, code: int, now: float) -> None:
        uptime = now - c.started
        if c.ready or uptime >= STABLE_AFTER:
            c.failures = 0
        else:
            c.failures += 1
        self._give_up_if_hopeless(c, code)
        delay = c.backoff.next(uptime)
        c.restarts += 1
        c.ready = False
        c.due = now + delay
        log.warning(
            "%s exited (%s); restarting in %gs (restart %d)",
            c.name, describe_exit(code), delay, c.restarts,
        )  # fmt: skip

    def _give_up_if_hopeless(self, c: Child, code: int) -> None:
        if c in self.worker_children:
            hopeless = all(w.failures >= GIVE_UP_AFTER for w in self.worker_children)
        else:
            hopeless = c.failures >= GIVE_UP_AFTER and not c.ever_ready
        if hopeless:
            who = "every worker" if c in self.worker_children else c.name
            raise GiveUp(
                f"{who} failed {c.failures} times in a row before becoming ready "
                f"(last exit {describe_exit(code)}); giving up, see its output above"
            )

    def _restart(self, c: Child) -> None:
        c.due = None
        try:
            self._starter(c)()
        except Unavailable as err:  # nats-server did not come up
            c.proc = None
            c.failures += 1
            self._give_up_if_hopeless(c, 1)
            delay = c.backoff.next(0.0)
            c.restarts += 1
            c.due = time.monotonic() + delay
            log.warning(
                "%s did not start (%s); restarting in %gs (restart %d)",
                c.name, err, delay, c.restarts,
            )  # fmt: skip
            return
        log.info("%s pid %s", c.name, c.pid)

    def _check_ready(self) -> None:
        """The gateway: /healthz answers. A worker: ready in /v1/models, on a new URL."""
        gw = self.gateway_child
        waiting = [w for w in self.worker_children if not w.ready and w.due is None]
        if gw.ready and not waiting:
            return
        if gw.proc is None or gw.due is not None:
            return
        try:
            if not gw.ready:
                if (
                    self.http.get(self.api + "/healthz", timeout=1, headers=_PROBE).status_code
                    != 200
                ):
                    return
                self._became_ready(gw)
            if not waiting:
                return
            r = self.http.get(self.api + "/v1/models", timeout=2, headers=_PROBE)
            seen = {w["id"]: w for m in r.json()["data"] for w in m["workers"] if w["ready"]}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return
        for c in waiting:
            beat = seen.get(c.name)
            # a dead worker's last heartbeat lingers a few seconds: the new run has a new URL
            if beat is not None and beat.get("url") != c.url:
                c.url = beat.get("url")
                self._became_ready(c)

    def _became_ready(self, c: Child) -> None:
        c.ready = c.ever_ready = True
        c.failures = 0

    def stop(self) -> None:
        for c in self.supervised:
            c.due = None
        stop_all(self.workers)
        stop_all([self.gateway] if self.gateway else [])
        self.nats.stop()
        if self._own_zygote is not None:
            self._own_zygote.close()
            self.zygote = self._own_zygote = None


def run_cluster(
    settings: Settings, workers: int, env: Mapping[str, str], store_dir: str | None = None
) -> int:
    console = Console(stderr=True, soft_wrap=True)
    cluster = Cluster(settings, workers, env, store_dir=store_dir, console=console)
    stopping: list[int] = []

    def _stop_signal(signum: int, frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, _stop_signal)
    signal.signal(signal.SIGINT, _stop_signal)
    try:
        try:
            api = cluster.start()
        except Unavailable as err:
            console.print(f"[red]error:[/] {escape(str(err))}", soft_wrap=True)
            return 1
        announced = False
        while not stopping:
            cluster.supervise()
            if not announced and cluster.all_ready:
                announced = True
                log.info(
                    "ready: API on %s, %d worker(s), NATS on %s. Ctrl-C stops everything.",
                    api, workers, cluster.nats.url,
                )  # fmt: skip
            time.sleep(0.1 if not cluster.all_ready else 0.25)
        log.info("stopping the cluster…")
        return 0
    except GiveUp as err:
        console.print(f"[red]error:[/] {escape(str(err))}", soft_wrap=True)
        return 1
    finally:
        cluster.stop()
