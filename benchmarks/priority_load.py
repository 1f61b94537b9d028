"""The workload of ``python -m benchmarks priority``, and one phase of it against a server.

Bulk: ``--bulk-clients`` closed-loop clients, each sending requests of ``--bulk-items``
texts of realistic lengths (the zaragoza-construction-faq mix of questions, answers and
passages, 8-256 tokens; the word generator of ``fleetserve.bench.tune.workload`` when that
package is absent). Interactive: one-sentence queries arriving open loop (Poisson) at
``--rate`` per second, each timed from its scheduled arrival, so a stalled server is
not excused by a client that waited for it (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fleetserve.bench.loadgen import percentile

from . import dist_mixed as mixed

JSON_HEADERS = {"content-type": "application/json"}
INTERACTIVE = {"x-priority": "interactive"}
LENGTHS = (8, 256)  # tokens per bulk text, specials included


@dataclass(frozen=True)
class Workload:
    bulk: list[list[str]]  # the bulk requests' texts
    tokens: list[int]  # tokens the model computes per bulk request (truncated)
    queries: list[str]  # one sentence each
    source: str  # where the texts came from

    @property
    def mean_tokens_per_item(self) -> float:
        return sum(self.tokens) / max(1, sum(len(b) for b in self.bulk))


def build_workload(
    tokenizer_dir: Path, max_seq_len: int, items: int, pool: int, seed: int = 0
) -> Workload:
    """``pool`` bulk requests of ``items`` texts each, and the interactive queries."""
    from fleetserve.bench.tune.workload import corpus, mix, sentences

    rng = random.Random(seed)
    try:
        texts, lengths = mix(tokenizer_dir, max(512, items), lo=LENGTHS[0], hi=LENGTHS[1])
        queries = [r["q"] for r in corpus()]
        source = "zaragoza-construction-faq (questions, answers, passages)"
    except RuntimeError:  # the corpus is not installed
        lengths = [_loguniform(rng, *LENGTHS) for _ in range(max(512, items))]
        words = mixed.single_token_words(tokenizer_dir)
        texts = mixed.texts([lengths], words, seed)[0]
        queries = sentences(tokenizer_dir, 64, 16, seed)
        source = "word generator (fleetserve.bench.tune.workload)"
    bulk, tokens = [], []
    for _ in range(pool):
        pick = [rng.randrange(len(texts)) for _ in range(items)]
        bulk.append([texts[i] for i in pick])
        tokens.append(sum(min(lengths[i], max_seq_len) for i in pick))
    rng.shuffle(queries)
    return Workload(bulk, tokens, queries, source)


def _loguniform(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


@dataclass(frozen=True)
class Bodies:
    """A workload encoded for one server (its route's model name)."""

    bulk: list[bytes]
    tokens: list[int]
    items: list[int]
    queries: list[bytes]

    @classmethod
    def of(cls, w: Workload, body: Callable[[list[str]], bytes]) -> Bodies:
        return cls(
            [body(b) for b in w.bulk],
            w.tokens,
            [len(b) for b in w.bulk],
            [body([q]) for q in w.queries],
        )


@dataclass(frozen=True)
class Load:
    bulk_clients: int
    rate: float  # interactive queries per second; 0: bulk alone
    seconds: float  # the measured window
    warm: float  # seconds of load before it
    header: bool = False  # X-Priority: interactive on the queries
    seed: int = 0
    first: int = 0  # where in the bulk pool this phase starts


@dataclass
class Sample:
    """One phase: bulk work done in the window, and the queries scheduled in it."""

    seconds: float
    bulk_tokens: float = 0.0  # each request's tokens prorated over its time in flight
    bulk_items: float = 0.0
    bulk_done: int = 0  # requests that finished in the window
    bulk_errors: int = 0
    query_ms: list[float] = field(default_factory=list)
    query_errors: int = 0
    error_codes: dict[int, int] = field(default_factory=dict)  # HTTP status (0: no reply)
    drain_s: float = 0.0  # waiting for what was in flight at the window's end

    @property
    def bulk_tokens_per_s(self) -> float:
        return self.bulk_tokens / self.seconds if self.seconds else 0.0

    @property
    def bulk_items_per_s(self) -> float:
        return self.bulk_items / self.seconds if self.seconds else 0.0

    def query(self, q: float) -> float:
        """The queries' latency quantile (nearest rank), ms; the median for 0.5."""
        if q == 0.5 and self.query_ms:
            return statistics.median(self.query_ms)
        return percentile(self.query_ms, q)


async def phase(
    url: str, bodies: Bodies, load: Load, transport: httpx.AsyncBaseTransport | None = None
) -> Sample:
    """The bulk clients (and the queries, if ``load.rate``) for ``warm + seconds``; then
    what is in flight is waited for. Bulk clients start no request after the window."""
    rng = random.Random(load.seed)
    q_headers = {**JSON_HEADERS, **INTERACTIVE} if load.header else JSON_HEADERS
    conc = load.bulk_clients
    bulk_log: list[tuple[float, float, int, int]] = []  # sent, finished, request, status
    query_log: list[tuple[float, float, int]] = []  # scheduled, finished, status
    nxt = itertools.count(load.first)
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    q_limits = httpx.Limits(max_connections=1024, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(timeout=600, limits=limits, transport=transport) as bulk,
        httpx.AsyncClient(timeout=600, limits=q_limits, transport=transport) as queries,
    ):
        t0 = time.perf_counter()
        start, end = t0 + load.warm, t0 + load.warm + load.seconds

        async def post(client: httpx.AsyncClient, body: bytes, headers: dict[str, str]) -> int:
            try:
                return (await client.post(url, content=body, headers=headers)).status_code
            except httpx.HTTPError:
                return 0

        async def bulk_client() -> None:
            while time.perf_counter() < end:
                i = next(nxt) % len(bodies.bulk)
                sent = time.perf_counter()
                code = await post(bulk, bodies.bulk[i], JSON_HEADERS)
                bulk_log.append((sent, time.perf_counter(), i, code))

        async def query(at: float, body: bytes) -> None:
            code = await post(queries, body, q_headers)
            query_log.append((at, time.perf_counter(), code))

        async def arrivals() -> None:
            tasks = []
            at = t0
            for k in itertools.count():
                at += rng.expovariate(load.rate)
                if at >= end:
                    break
                await asyncio.sleep(max(0.0, at - time.perf_counter()))
                body = bodies.queries[k % len(bodies.queries)]
                tasks.append(asyncio.create_task(query(at, body)))
            await asyncio.gather(*tasks)

        extra = [arrivals()] if load.rate > 0 else []
        await asyncio.gather(*(bulk_client() for _ in range(conc)), *extra)
        drained = time.perf_counter()
    return tally(bodies, bulk_log, query_log, start, end, drained)


def tally(
    bodies: Bodies,
    bulk_log: Sequence[tuple[float, float, int, int]],
    query_log: Sequence[tuple[float, float, int]],
    start: float,
    end: float,
    drained: float,
) -> Sample:
    s = Sample(end - start, drain_s=max(0.0, drained - end))
    for sent, finished, i, code in bulk_log:
        overlap = min(finished, end) - max(sent, start)
        if overlap <= 0:
            continue
        if code != 200:
            s.bulk_errors += 1
            s.error_codes[code] = s.error_codes.get(code, 0) + 1
            continue
        share = overlap / max(finished - sent, 1e-9)
        s.bulk_tokens += share * bodies.tokens[i]
        s.bulk_items += share * bodies.items[i]
        s.bulk_done += start <= finished <= end
    for at, finished, code in query_log:
        if not start <= at <= end:
            continue
        if code == 200:
            s.query_ms.append((finished - at) * 1e3)
        else:
            s.query_errors += 1
            s.error_codes[code] = s.error_codes.get(code, 0) + 1
    return s
