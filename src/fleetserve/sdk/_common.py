"""What the sync and async clients share: their settings, request headers, decoding,
retry policy, one request (``Call``), a call that may go as several (``Job``), and the
chunk plan of a long call."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx
import numpy as np

from ..wire import (
    DeadlineExceeded,
    Encoding,
    FleetError,
    InternalError,
    InvalidInput,
    Priority,
    Unavailable,
    error_from_body,
    parse_priority,
)
from ..wire.codec import encoding_of, loads
from ._chunks import Limits, Span, limits_by_model, plan

if TYPE_CHECKING:
    from rich.progress import Progress

MSGPACK = Encoding.MSGPACK.value
T = TypeVar("T")
Array = np.ndarray[Any, Any]
Texts = str | list[str]
MODELS = "/v1/models"


def priority_of(raw: str | None) -> Priority | None:
    """``"interactive"`` or ``"batch"`` (``X-Priority``); anything else is refused here."""
    if raw is None:
        return None
    try:
        return parse_priority(raw)
    except ValueError as exc:
        raise InvalidInput(f"priority {exc}", field="priority") from None


class BaseClient:
    """What the sync and async clients hold: the server, the retry policy, the
    pipelining of long calls and the limits the server advertised (fetched once)."""

    def __init__(
        self,
        base_url: str,
        timeout: float,
        max_retries: int,
        max_backoff: float,
        *,
        max_in_flight: int = 4,
        progress: bool = False,
        priority: str | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_backoff = max_backoff
        self.max_in_flight = max_in_flight
        self.progress = progress
        self.priority = priority_of(priority)
        self._limits: dict[str, Limits] | None = None  # per model, from GET /v1/models

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def _show(self, progress: bool | Progress | None) -> bool | Progress:
        return self.progress if progress is None else progress

    def _priority(self, priority: str | None) -> Priority | None:
        return priority_of(priority) or self.priority

    def _spans(self, job: Job[Any], sizes: list[int]) -> list[Span] | None:
        """The chunks of a long call (after the limits are fetched); None: one request."""
        limits = (self._limits or {}).get(job.model, Limits())
        spans = plan(sizes, limits, job.base_bytes(), job.extra_tokens)
        return spans if len(spans) > 1 else None

    def _keep_limits(self, resp: httpx.Response | None) -> None:
        """Cache what ``GET /v1/models`` said (nothing usable: the safe defaults)."""
        found: dict[str, Limits] = {}
        if resp is not None and resp.status_code == 200:
            try:
                enc = encoding_of(resp.headers.get("content-type"))
                found = limits_by_model(loads(resp.content, enc))
            except FleetError:
                pass
        self._limits = found


RETRY_STATUSES = (429, 503)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request: where it goes, its msgpack body, and how to read the reply body."""

    path: str
    body: bytes
    decode: Callable[[Any], T]

    def headers(self, timeout: float | None, priority: Priority | None = None) -> dict[str, str]:
        headers = {"content-type": MSGPACK, "accept": MSGPACK}
        if timeout is not None:
            headers["x-request-timeout"] = repr(float(timeout))
        if priority is not None:
            headers["x-priority"] = priority.value
        return headers

    def result(self, resp: httpx.Response) -> T:
        raise_for_error(resp)
        return self.decode(loads(resp.content, Encoding.MSGPACK))


Merge = Callable[[list[T], list[int]], T]  # the runs' results in order, and their starts


@dataclass(frozen=True)
class Job(Generic[T]):
    """One call whose list of items may go as several requests."""

    model: str  # whose limits apply
    inputs: Any  # a list that may be split, or one item (sent whole)
    field: str  # the items' body field, as the server's errors name it
    make: Callable[[Any], Call[T]]  # the request for a run of the items
    merge: Merge[T]
    extra_tokens: int = 0  # what every item brings along (the query, for scoring)

    @property
    def items(self) -> list[object] | None:
        return self.inputs if isinstance(self.inputs, list) else None

    @property
    def count(self) -> int:
        return len(self.inputs) if isinstance(self.inputs, list) else 1

    def whole(self) -> Call[T]:
        return self.make(self.inputs)

    def chunk(self, span: Span) -> Call[T]:
        return self.make(self.inputs[span[0] : span[1]])

    def base_bytes(self) -> int:
        """The body's bytes without its items."""
        return len(self.make([]).body)


def raise_for_error(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    raise error_of(resp)


def error_of(resp: httpx.Response) -> FleetError:
    retry_after = _retry_after(resp)
    ct = resp.headers.get("content-type", "")
    try:
        enc = Encoding.MSGPACK if "msgpack" in ct else Encoding.JSON
        body = loads(resp.content, enc)
    except FleetError:
        return InternalError(f"HTTP {resp.status_code}: {resp.text[:200]}")
    return error_from_body(body, retry_after=retry_after)


def _retry_after(resp: httpx.Response) -> float | None:
    raw = resp.headers.get("retry-after")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def retry_wait(
    resp: httpx.Response, attempt: int, retries: int, cap: float, deadline: float
) -> float | None:
    """Seconds to wait before sending again, or None to answer with ``resp``: a 429 or
    503 is retried ``retries`` times, after its ``Retry-After`` (a server that tunes or
    loads says how long) or a jittered back-off up to ``cap``; never past the call's
    deadline: a wait that would end after it answers now, with the server's estimate
    in the error's ``retry_after``."""
    if resp.status_code not in RETRY_STATUSES or attempt >= retries:
        return None
    said = _retry_after(resp)
    wait = said if said is not None else backoff(resp, attempt, cap)
    return wait if time.monotonic() + wait < deadline else None


def backoff(resp: httpx.Response, attempt: int, cap: float) -> float:
    """Seconds to wait before retrying: Retry-After when given, else jittered exponential."""
    ra = _retry_after(resp)
    if ra is not None:
        return min(ra, cap)
    return float(min(cap, 0.1 * 2**attempt) * (0.5 + random.random() / 2))


@contextlib.contextmanager
def network_errors(timeout: float) -> Iterator[None]:
    """Raise transport failures as the same typed errors the server would send."""
    try:
        yield
    except httpx.TimeoutException:
        raise DeadlineExceeded(f"no response within {timeout:.3f}s") from None
    except httpx.TransportError as exc:
        try:
            where = f" at {exc.request.url.scheme}://{exc.request.url.netloc.decode()}"
        except RuntimeError:  # an error raised before any request was made
            where = ""
        raise Unavailable(f"cannot reach the server{where}: {exc}") from None
