"""The gateway: a thin raw-ASGI app in front of the queue's Publisher.

For inference routes it reads the route, headers and body size, attaches an
envelope and publishes the raw body. When the reply arrives in the client's
encoding, its bytes go back untouched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time

from ..catalog import Catalog
from ..logs import kv
from ..logs.access import Access, request_id
from ..logs.context import for_request
from ..metrics import Metrics
from ..queue import Publisher
from ..settings import Settings
from ..tracing import NULL_REQUEST, NULL_TRACER, RequestTrace, Tracer
from ..wire import (
    Encoding,
    FleetError,
    InternalError,
    InvalidInput,
    NotFound,
    Principal,
    Task,
    error_from_body,
    split_model_name,
)
from ..wire import Scope as KeyScope
from ..wire.codec import accept_of, encoding_of
from . import compat_http, model_list
from . import envelope as env_mod
from .auth import Authenticator, require
from .disconnect import Watched
from .errors import body_response, crashed, error_response, stamped, stopped
from .http import Receive, Scope, Send, declared_length, header, read_body, respond
from .keepalive import Grant, KeepAlives, released_model
from .model_routes import ModelRoutes
from .model_routes import handles as model_admin
from .readiness import not_ready_error
from .request_limits import RequestLimits
from .request_memory import RequestMemory, Reservation
from .routes import BODY_MODEL_ROUTES as _BODY_MODEL_ROUTES  # noqa: F401 (tests read it)
from .routes import PATH_MODEL_ROUTES as _PATH_MODEL_ROUTES  # noqa: F401
from .routes import inference_route, is_adapters
from .streaming import relay
from .wiring import NO_ROUTES, Hooks, Pages, Routes

log = logging.getLogger("fleetserve.gateway")

_TEXT = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


class Gateway:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        queue: Publisher,
        metrics: Metrics,
        *,
        hooks: Hooks,
        routes: Routes = NO_ROUTES,
        dashboard: Pages | None = None,
        authenticator: Authenticator | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        """``dashboard``: the process's (``gateway_setup.build_dashboard``); None: none."""
        # the key ring first: a bad auth setting refuses to start (ValueError), never opens
        self.auth = (
            authenticator if authenticator is not None else Authenticator.from_settings(settings)
        )
        self.adapters = routes.adapters  # /v1/adapters[/...]: it checks scopes itself
        self.finetune = routes.finetune  # /v1/files, /v1/fine_tuning/: it checks scopes itself
        self.tracer = tracer or NULL_TRACER  # spans per request (fleetserve.tracing)
        self.calls = routes.calls  # resolves the adapter a request calls (None: no adapters)
        # POST /v1/models, DELETE /v1/models/{id}: hot add and remove (None: not here)
        self.models = (
            None if routes.models is None else ModelRoutes.of(routes.models, catalog, settings)
        )
        # a model's interactive threshold (its profile's), in predicted tokens
        self.interactive_cost = hooks.interactive_cost
        self.settings = settings
        self.access_log = settings.access_log  # a line per request
        self.catalog = catalog
        self.queue = queue
        self.metrics = metrics
        self.ready = hooks.ready
        self.alive = hooks.alive  # False: a stage crashed, /healthz says 503
        self.not_ready = hooks.not_ready
        self.ready_in = hooks.ready_in
        self.models_info = hooks.models_info or (lambda: model_list.entries(self.catalog))
        self.memory = hooks.memory
        # X-Keep-Alive's caps; ends a model's keep-alive where it lives (None: not here)
        self.keep_alives = KeepAlives(settings.max_keep_alive, settings.max_kept_alive_per_tenant)
        self.release_keep_alive = hooks.release_keep_alive
        self._startup = hooks.on_startup
        self._shutdown = hooks.on_shutdown
        log.info(self.auth.describe())
        self.dashboard = dashboard
        # inference bodies: nesting, items and request memory, before anything decodes them
        self.request_limits = RequestLimits.from_settings(settings)
        self.request_memory = RequestMemory.from_settings(settings)
        self.stopping = False  # set by the process at its stop: a cancel then gets a 503

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._logged(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                if self._startup:
                    await self._startup()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self._shutdown:
                    await self._shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _logged(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``_http`` with the request id and timing headers on every response, and one
        access line when it is done (``access_log`` setting)."""
        scope["fleetserve.access"] = access = Access.of(scope)
        send = stamped(send, access)
        try:
            with for_request(access.request_id):  # a store's log line names the request
                await self._http(scope, receive, send)
        except Exception:  # a bug in a handler: a 500, never a dead connection or process
            log.exception("request failed", extra=kv(path=access.path, id=access.request_id))
            await crashed(send, access)
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            await stopped(send, access, self.settings.retry_after)  # answered: not re-raised
        finally:
            if self.access_log:
                access.emit()

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        accept = Encoding.JSON
        try:
            # every /v1/ route needs a valid key (when keys are configured), TEI's and
            # infinity's drop-in routes too
            compat = compat_http.handles(method, path)
            keyed = path.startswith("/v1/") or compat
            principal = self.auth.authenticate(scope) if keyed else None
            if principal is not None:  # every route's access line names the tenant
                _access(scope).tenant = principal.tenant
            route = inference_route(method, path)
            if route is not None:  # inference first: the dashboard stays off the hot path
                assert principal is not None
                require(principal, KeyScope.INFER)
                await self._traced(scope, receive, send, *route, principal=principal)
            elif compat:
                assert principal is not None
                require(principal, KeyScope.INFER)
                await compat_http.serve(self, scope, receive, send, principal)
            elif method == "GET" and path == "/healthz":
                ok = self.alive()
                health = (200, {"status": "ok"}) if ok else (503, {"status": "failed"})
                await respond(send, *body_response(*health, accept))
            elif method == "GET" and path == "/readyz":
                why = self.not_ready() if self.not_ready is not None else ""
                ok = self.alive() and self.ready() and self.queue.healthy and not why
                said: dict[str, object] = {"ready": ok, **({"reason": why} if why else {})}
                await respond(send, *body_response(200 if ok else 503, said, accept))
            elif (listed := model_list.listing(method, path)) is not None:
                memory = self.memory() if self.memory is not None and not listed else None
                body = model_list.body(listed, self.models_info(), memory, self.catalog)
                await respond(send, *body_response(200, body, accept))
            elif (released := released_model(method, path)) is not None:
                assert principal is not None
                require(principal, KeyScope.ADMIN)
                body = await self.keep_alives.release_route(
                    released, self.catalog, self.release_keep_alive
                )
                await respond(send, *body_response(200, body, accept))
            elif self.models is not None and model_admin(method, path):
                assert principal is not None
                await self.models(scope, receive, send, principal)
            elif self.adapters is not None and is_adapters(path):
                assert principal is not None
                await self.adapters(scope, receive, send, principal)
            elif self.finetune is not None and self.finetune.handles(path):
                assert principal is not None
                await self.finetune(scope, receive, send, principal)
            elif method == "GET" and path == "/metrics":  # with keys: the metrics scope
                self.auth.authorize(scope, KeyScope.METRICS)
                await respond(send, 200, _TEXT, self.metrics.render())
            elif method == "GET" and path == "/openapi.json":  # with keys: any valid key
                self.auth.authenticate(scope)
                from .openapi import CACHE, operations  # on first use: every family's types

                views = self.dashboard.views if self.dashboard is not None else ()
                ops = operations(
                    adapters=self.adapters is not None,
                    finetune=self.finetune is not None,
                    views=[(v.prefix, v.name) for v in views],
                    models=self.models is not None,
                )
                await respond(send, 200, [(b"content-type", b"application/json")], CACHE.get(ops))
            elif self.dashboard is not None and self.dashboard.handles(path):  # its events too
                await self.dashboard(scope, receive, send)
            else:
                raise NotFound(f"no route for {method} {path}", field="path")
        except FleetError as err:
            _access(scope).code = err.code
            await respond(send, *error_response(err, accept))

    async def run_native(
        self, scope: Scope, receive: Receive, send: Send, task: Task, model: str | None,
        principal: Principal,
    ) -> None:  # fmt: skip
        """One inference request the native way (the drop-in routes' translated ones)."""
        await self._traced(scope, receive, send, task, model, principal=principal)

    async def _traced(
        self, scope: Scope, receive: Receive, send: Send, task: Task, model: str | None,
        *, principal: Principal,
    ) -> None:  # fmt: skip
        """``_infer`` inside the request's span (tracing off: the null one, a no-op), holding
        its request memory until its reply (a stream's last chunk too) is sent."""
        trace = self.tracer.request(scope)
        held = self.request_memory.reservation()
        try:
            await self._infer(
                scope, receive, trace.watch(send), task, model,
                principal=principal, trace=trace, held=held,
            )  # fmt: skip
        finally:
            held.release()
            trace.end()

    async def _infer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        task: Task,
        model: str | None,
        *,
        principal: Principal,
        held: Reservation,  # its request memory: ``_traced`` gives it back once all is sent
        trace: RequestTrace = NULL_REQUEST,
    ) -> None:
        t0 = time.perf_counter()
        accept = Encoding.JSON
        route = task.value
        access = _access(scope)
        access.tenant = principal.tenant
        grant: Grant | None = None  # what its X-Keep-Alive got
        published = False  # once it is, a worker may have kept its model alive
        try:
            content_type = encoding_of(header(scope, b"content-type"))
            accept = accept_of(header(scope, b"accept"), content_type)
            held.grow(declared_length(scope, self.settings.max_body_bytes) or 0)
            # grown as the chunks arrive: a body with no Content-Length is held to it too
            body = await read_body(scope, receive, self.settings.max_body_bytes, held.grow)
            access.bytes_in = len(body)
            await self.request_limits.check(body, content_type, task)
            stream = False
            route_model = model is not None  # native routes: an adapter may be a body field
            if model is None:
                model, stream = env_mod.model_from_body(body, content_type)
            elif task is Task.GENERATE:
                stream = env_mod.stream_flag(body, content_type)
            if not model:
                raise InvalidInput("the model id in the path is empty", field="path")
            model, called = split_model_name(model)
            access.model = model
            if called is None and route_model:
                called = env_mod.adapter_field(body, content_type)
            spec = self.catalog.get(model)
            adapter = None
            if called is not None:
                if self.calls is None:
                    raise InvalidInput("this server serves no adapters", field="adapter")
                adapter = await self.calls.resolve(principal, model, spec.family, called)
            if not self.ready():
                raise not_ready_error(self.not_ready, self.ready_in, self.settings.retry_after)
            default = (
                self.settings.generation_timeout
                if task in (Task.CHAT, Task.GENERATE)
                else self.settings.request_timeout
            )
            timeout = env_mod.parse_timeout(
                header(scope, b"x-request-timeout"),
                default,
                self.settings.max_request_timeout,
            )
            asked = env_mod.parse_keep_alive(header(scope, b"x-keep-alive"))
            if asked is not None:
                grant = self.keep_alives.grant(
                    principal.tenant, model, asked, spec.max_keep_alive, timeout
                )
            claimed = env_mod.parse_priority_header(header(scope, b"x-priority"))
            priority = env_mod.classify(
                env_mod.cost_of(len(body)), claimed, self.interactive_cost(model)
            )
            env = env_mod.build(
                model=model,
                task=task,
                content_type=content_type,
                accept=accept,
                body_size=len(body),
                timeout=timeout,
                request_id=access.request_id,  # the client's, if sane, else a new one
                tenant=principal.tenant,  # the key's tenant (open: X-Tenant or default)
                keep_alive=None if grant is None else grant.keep_alive,
                adapter=adapter,
                priority=priority,
            )
            # its trace context rides with it to the worker; the span names the client's id,
            # the queue a unique one (two clients may send the same x-request-id)
            env = dataclasses.replace(trace.stamp(env), request_id=access.envelope_id())
            access.priority = env.priority.value
            # a client that hangs up (or a deadline that passes) cancels the work
            reply_to = await self.queue.publish(env, body)
            published = True
            if grant is not None:  # a worker applies it now, whatever comes after
                self.keep_alives.kept(grant)
            pending = Watched(reply_to, receive, self.queue, env)
            if stream:
                ended = functools.partial(self._streamed, route, env.model, t0)
                await relay(send, pending, env, trace, access=access, grant=grant, ended=ended)
                return
            reply = await pending.wait(env.deadline - time.time())
            access.queue_ms = reply.timings.get("queue_ms")
            access.inference_ms = reply.timings.get("inference_ms")
            trace.replied(reply)
            if reply.error is not None:
                raise error_from_body(reply.error, retry_after=reply.timings.get("retry_after"))
        except FleetError as err:
            access.code = err.code
            self._count(route, model, err.code)
            if grant is not None and not published:  # no worker saw it: nothing kept alive
                self.keep_alives.undo(grant)
            await respond(send, *error_response(err, accept))
            return
        except Exception:
            if grant is not None and not published:
                self.keep_alives.undo(grant)
            log.exception("gateway failure")
            self._count(route, model, InternalError.code)
            await crashed(send, access, accept)  # a 500 (a stream: on its access line)
            return
        total = time.perf_counter() - t0
        self.metrics.stage_latency.labels(model, "total").observe(total)
        if self.dashboard is not None:  # the fleet view's throughput and latency
            self.dashboard.observe(model, total)
        self._count(route, model, "ok")
        headers = [
            (b"content-type", reply.content_type.value.encode()),
            (b"x-request-id", access.request_id.encode()),
            (b"x-queue-time-ms", f"{reply.timings.get('queue_ms', 0.0):.3f}".encode()),
            (b"x-inference-time-ms", f"{reply.timings.get('inference_ms', 0.0):.3f}".encode()),
            (b"x-total-time-ms", f"{total * 1e3:.3f}".encode()),
            (b"x-priority", env.priority.value.encode()),
            *(grant.headers() if grant is not None else ()),
        ]
        await respond(send, 200, headers, reply.body)

    def _streamed(self, route: str, model: str, t0: float, code: str) -> None:
        """A stream ended with ``code``: counted, and its latency observed."""
        self._count(route, model, code)
        self.metrics.stage_latency.labels(model, "total").observe(time.perf_counter() - t0)
        if code == "ok" and self.dashboard is not None:
            self.dashboard.observe(model, time.perf_counter() - t0)

    def _count(self, route: str, model: str | None, code: str) -> None:
        # unknown models are counted under one label to keep cardinality bounded
        label = model if model is not None and model in self.catalog else "unknown"
        self.metrics.requests.labels(route, label, code).inc()


def _access(scope: Scope) -> Access:
    """The request's access record (a throwaway one where ``_logged`` did not run)."""
    found = scope.get("fleetserve.access")
    if isinstance(found, Access):
        return found
    return Access(scope.get("method", ""), scope.get("path", ""), request_id(None))
