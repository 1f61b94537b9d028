"""Bounded HTTP parsing: uvicorn's httptools protocol with limits on what a client may hold.

Without them one client can grow a request head without end (httptools keeps a partial
header value in memory until it completes) or hold a socket open by sending a byte now
and then. Each connection here is bounded:

- its head (request line and headers) by bytes (431), header fields (431) and the
  request-target's length (414), then closed;
- its head by time from its first byte, or from connecting (408, closed; a connection
  that sent nothing is closed silently), its body by the time between bytes (408);
- the server by open connections: one beyond the cap gets 503 and is closed unread.

Idle kept-alive connections are closed by uvicorn's own ``timeout_keep_alive``. Each
error body has fleetserve's shape, ``{"error": {"code", "message", "field"}}``.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .settings_limits import Limits
from .wire import FleetError, InvalidInput, PayloadTooLarge, Unavailable

_HEAD, _BODY = 1, 2  # what the parser is reading; None: between requests
_LINE = 16  # a head's bytes besides its target and fields: "GET  HTTP/1.1\r\n" and "\r\n"
_FIELD = 4  # a field's bytes besides its name and value: ": " and "\r\n"
REFUSED_LINGER_S = 1.0  # how long a refused connection drops what it is sent


def enabled(limits: Limits) -> bool:
    """Whether any of the limits this protocol enforces is set (else: plain httptools)."""
    return any(
        (
            limits.http_max_header_bytes,
            limits.http_max_headers,
            limits.http_max_url_bytes,
            limits.http_header_timeout,
            limits.http_body_timeout,
            limits.http_max_connections,
        )
    )


def protocol_class(limits: Limits, retry_after: float) -> type[LimitedHttpProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` bound to ``limits``; its
    connections share one count (one class per server)."""

    class Bound(LimitedHttpProtocol):
        pass

    Bound.limits = limits
    Bound.retry_after = retry_after
    Bound.admitted = set()
    return Bound


class _Reject(Exception):
    """Raised in a parser callback: answer ``status`` with ``error`` and close."""

    def __init__(self, status: int, error: FleetError) -> None:
        super().__init__(error.message)
        self.status = status
        self.error = error


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's ``HttpToolsProtocol``, bounded by ``limits`` (see the module's doc)."""

    limits: Limits
    retry_after: float
    admitted: set[LimitedHttpProtocol]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.url, self.headers = b"", []  # as if a head had begun: the checks read them
        self._phase: int | None = _HEAD
        self._deadline = math.inf
        self._watch: asyncio.TimerHandle | None = None
        self._head_got = False  # whether the open head has had a byte yet
        self._head_bytes = 0  # bytes of the open head seen in earlier chunks
        self._held = False  # whether the app held the body back at the last check
        self._chunk = 0  # the length of the chunk being parsed
        self._began = False  # whether a head began in it
        self._before = 0  # its bytes known to precede the open head
        self._refused = False  # over the connection cap: answered, lingering to close

    # -- the connection -------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self.limits.http_max_connections
        if cap and len(self.admitted) >= cap:
            self._refuse(cap)
            return
        self.admitted.add(self)
        self._start_head()

    def _refuse(self, cap: int) -> None:
        """Answer 503 at once, unread, so that a refused socket costs no parsing; then
        half-close and linger ``REFUSED_LINGER_S``, dropping what the client sends: its
        request meeting a closed socket would reset the connection, and a reset throws
        away the answer before the client reads it."""
        error = Unavailable(
            f"the server holds its limit of {cap} open connections "
            "(FLEETSERVE_HTTP_MAX_CONNECTIONS); retry later",
            retry_after=self.retry_after,
        )
        self._refused = True
        self._answer(503, error, close=False)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._watch = self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.admitted.discard(self)
        self._phase = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self.transport.is_closing():  # dropped, unread
            return
        self._unset_keepalive_if_required()
        if self._phase is None:
            self._start_head()
        self._head_got = True
        self._chunk, self._began, self._before = len(data), False, 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Reject):
                self._reject(exc.__context__)
            else:
                self._invalid()
            return
        except httptools.HttpParserError:
            self._invalid()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._phase == _HEAD and not self.transport.is_closing():
            # a head still open: its bytes in this chunk are all of it, or what followed
            # the requests and bodies that completed in it
            self._head_bytes += len(data) - self._before if self._began else len(data)
            rejected = self._head_error(self._head_bytes)
            if rejected is not None:
                self._reject(rejected)

    def _reject(self, reject: _Reject) -> None:
        self._drop_head()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self.transport.close()  # a pipelined request: no answer amid another's
        else:
            self._answer(reject.status, reject.error)

    def _drop_head(self) -> None:
        """Let the open head go now: the loop may reach this connection's close only
        after parsing many others (their heads all held meanwhile)."""
        self.headers.clear()
        self.url = b""
        self.parser = None  # type: ignore[assignment]

    def _invalid(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    # -- parser callbacks -----------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase != _HEAD:
            self._start_head()
            self._head_got = True
        self._began = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        most = self.limits.http_max_header_bytes
        if most and self._head_bytes + self._chunk > most:  # it may be too large: count
            size = _LINE + len(self.url) + sum(len(n) + len(v) + _FIELD for n, v in self.headers)
            # this head's bytes in the chunk precede any head that opens after it
            self._before += max(0, size - self._head_bytes)
        else:
            size = 0
        error = self._head_error(size)
        if error is not None:
            raise error
        self._phase = _BODY
        self._held = False
        self._arm(self.limits.http_body_timeout)
        super().on_headers_complete()

    def _head_error(self, size: int) -> _Reject | None:
        """What to answer if the open head's ``size`` in bytes, its target or its
        fields are over their limits; None if none is."""
        limits = self.limits
        error: _Reject | None = None
        if limits.http_max_header_bytes and size > limits.http_max_header_bytes:
            error = _too_large(limits.http_max_header_bytes)
        elif limits.http_max_url_bytes and len(self.url) > limits.http_max_url_bytes:
            error = _Reject(
                414,
                PayloadTooLarge(
                    f"the request target is longer than {limits.http_max_url_bytes} bytes "
                    "(FLEETSERVE_HTTP_MAX_URL_BYTES)",
                    field="url",
                ),
            )
        elif limits.http_max_headers and len(self.headers) > limits.http_max_headers:
            error = _Reject(
                431,
                PayloadTooLarge(
                    f"the request has more than {limits.http_max_headers} header fields "
                    "(FLEETSERVE_HTTP_MAX_HEADERS)",
                    field="headers",
                ),
            )
        return error

    def on_body(self, body: bytes) -> None:
        self._before += len(body)
        if self.limits.http_body_timeout:
            self._deadline = self.loop.time() + self.limits.http_body_timeout
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = None
        super().on_message_complete()

    # -- the watch over head and body times -----------------------------------------
    def _start_head(self) -> None:
        self._phase = _HEAD
        self._head_got = False
        self._arm(self.limits.http_header_timeout)

    def _arm(self, seconds: float) -> None:
        if not seconds:
            self._deadline = math.inf
            return
        self._deadline = self.loop.time() + seconds
        if self._watch is not None and self._watch.when() > self._deadline:
            self._watch.cancel()  # a later check than this deadline needs
            self._watch = None
        if self._watch is None:
            self._watch = self.loop.call_at(self._deadline, self._on_watch)

    def _on_watch(self) -> None:
        self._watch = None
        if self._phase is None or self.transport.is_closing() or self._deadline == math.inf:
            return
        now = self.loop.time()
        if self._phase == _BODY and (self._held or self._app_holds_body()):
            # the app is not reading the body (or was not at the last check): not the
            # client's delay; its clock starts again once the app lets it send
            self._held = self._app_holds_body()
            self._deadline = max(self._deadline, now + self.limits.http_body_timeout)
        if now < self._deadline:
            self._watch = self.loop.call_at(self._deadline, self._on_watch)
            return
        cycle = self.cycle
        busy = cycle is not None and not cycle.response_complete
        if self._phase == _HEAD:
            if busy:  # a pipelined head: finish the answer in progress, then close
                cycle.keep_alive = False
                self.flow.pause_reading()
                self._phase = None
            elif not self._head_got:
                self.transport.close()
            else:
                self._drop_head()
                secs = self.limits.http_header_timeout
                self._answer(
                    408,
                    InvalidInput(
                        f"the request's head did not arrive within {secs:g} s "
                        "(FLEETSERVE_HTTP_HEADER_TIMEOUT)"
                    ),
                )
        elif busy and not cycle.response_started:
            cycle.disconnected = True  # the app sees a hang-up
            cycle.message_event.set()
            secs = self.limits.http_body_timeout
            self._answer(
                408,
                InvalidInput(
                    f"no byte of the request's body arrived for {secs:g} s "
                    "(FLEETSERVE_HTTP_BODY_TIMEOUT)",
                    field="body",
                ),
            )
        else:
            self.transport.close()

    def _app_holds_body(self) -> bool:
        """Whether the body waits on the app: reading paused until it takes what came,
        or a client waiting for the ``100 Continue`` it has not asked for yet."""
        cycle = self.cycle
        return self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue)

    def _answer(self, status: int, error: FleetError, *, close: bool = True) -> None:
        """Write ``status`` with ``error``'s body, then close the connection."""
        body = json.dumps(error.to_body()).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        if error.retry_after is not None:
            head.append(b"retry-after: %d\r\n" % max(1, math.ceil(error.retry_after)))
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
        self._phase = None
        self.transport.write(b"".join(head))
        if close:
            self.transport.close()


def _too_large(most: int) -> _Reject:
    return _Reject(
        431,
        PayloadTooLarge(
            f"the request's head (request line and headers) is larger than {most} bytes "
            "(FLEETSERVE_HTTP_MAX_HEADER_BYTES)",
            field="headers",
        ),
    )
