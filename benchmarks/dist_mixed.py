"""The mixed workload and its closed-loop client.

Request sizes follow the simulation's mix (``fleetserve bench sim``): most requests are one
item, a quarter 2-32, a twentieth 33-256; item lengths are log-uniform over 8-512
tokens and the model truncates them at its ``max_seq_len``. Everything is drawn from
one seed, so every mode at a given concurrency gets the same sequence of requests.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fleetserve.bench.sim.params import DEFAULT_MIX
from fleetserve.bench.tune.workload import _WORDS

ITEM_TOKENS = (8, 512)
MIX = DEFAULT_MIX  # (weight, fewest items, most items)


def make_lengths(
    n: int,
    seed: int = 0,
    mix: Sequence[tuple[float, int, int]] = MIX,
    item_tokens: tuple[int, int] = ITEM_TOKENS,
) -> list[list[int]]:
    """``n`` requests, each a list of item lengths in tokens (specials included)."""
    rng = random.Random(seed)
    weights = [w for w, _, _ in mix]

    def loguni(lo: int, hi: int) -> int:
        return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))

    out = []
    for _ in range(n):
        _, lo, hi = rng.choices(list(mix), weights)[0]
        out.append([loguni(*item_tokens) for _ in range(loguni(lo, hi))])
    return out


def single_token_words(tokenizer_dir: Path) -> list[str]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    words = sorted(set(_WORDS))
    one = [w for w in words if len(tok.encode(w, add_special_tokens=False).ids) == 1]
    return one


def texts(lengths: Sequence[Sequence[int]], words: Sequence[str], seed: int = 0) -> list[list[str]]:
    """Each item as ``length - 2`` single-token words: ``length`` ids with [CLS]/[SEP]."""
    rng = random.Random(seed + 1)
    return [[" ".join(rng.choices(words, k=max(1, n - 2))) for n in req] for req in lengths]


def bodies(model: str, items: Sequence[Sequence[str]]) -> list[bytes]:
    """The OpenAI-style bodies ``python -m benchmarks embed`` sends (base64 encoding)."""
    return [
        json.dumps({"model": model, "input": list(x), "encoding_format": "base64"}).encode()
        for x in items
    ]


def tokens(lengths: Sequence[Sequence[int]], cap: int) -> list[int]:
    """Tokens the model computes per request: each item truncated at ``cap``."""
    return [sum(min(n, cap) for n in req) for req in lengths]


@dataclass(frozen=True)
class Requests:
    """The request pool: bodies, tokens the model computes, items per request."""

    payloads: list[bytes]
    costs: list[int]
    sizes: list[int]

    @classmethod
    def build(
        cls, model: str, lengths: Sequence[Sequence[int]], words: Sequence[str], cap: int, seed: int
    ) -> Requests:
        payloads = bodies(model, texts(lengths, words, seed))
        return cls(payloads, tokens(lengths, cap), [len(x) for x in lengths])


# what the workers computed in the window (their token counters), if it can be read
ServerTokens = Callable[[httpx.AsyncClient], Awaitable[float]]


@dataclass
class Point:
    """One measurement: ``concurrency`` clients for ``seconds`` against one mode."""

    mode: str
    concurrency: int
    round: int
    seconds: float
    requests: int = 0
    tokens: int = 0  # of the requests that completed in the window
    server_tokens: float | None = None  # the workers' count over the window
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    single_ms: list[float] = field(default_factory=list)  # one-item requests only

    @property
    def tokens_per_s(self) -> float:
        """The workers' rate where known: completions are too coarse when one request
        carries seconds of work."""
        n = self.server_tokens if self.server_tokens is not None else self.tokens
        return n / self.seconds if self.seconds else 0.0


async def closed_loop(
    url: str,
    reqs: Requests,
    point: Point,
    *,
    warm: float = 1.0,
    first: int = 0,
    server_tokens: ServerTokens | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Point:
    """``point.concurrency`` clients send back to back, taking requests in sequence
    from ``first`` on.

    The window is ``[warm, warm + seconds]`` after the start. Throughput: what the
    workers computed in it (``server_tokens``), or else the tokens of the requests that
    complete in it. Latency: every request sent in it, however late it ends, so slow
    requests are not left out. Clients stop sending at the window's end and what is
    still in flight is waited for.
    """
    conc = point.concurrency
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    counter = first
    done: list[tuple[float, float, int, bool]] = []  # sent, finished, request, ok
    async with (
        httpx.AsyncClient(timeout=120, limits=limits, transport=transport) as client,
        httpx.AsyncClient(timeout=10, transport=transport) as probe,
    ):
        t0 = time.perf_counter()
        start, end = t0 + warm, t0 + warm + point.seconds

        async def one_client() -> None:
            nonlocal counter
            while time.perf_counter() < end:
                i = counter % len(reqs.payloads)
                counter += 1
                sent = time.perf_counter()
                r = await client.post(url, content=reqs.payloads[i], headers=headers)
                done.append((sent, time.perf_counter(), i, r.status_code == 200))

        async def count(read: ServerTokens) -> None:
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            a = await read(probe)
            await asyncio.sleep(max(0.0, end - time.perf_counter()))
            point.server_tokens = await read(probe) - a

        extra = [count(server_tokens)] if server_tokens is not None else []
        await asyncio.gather(*(one_client() for _ in range(conc)), *extra)
    for sent, finished, i, ok in done:
        if not ok:
            point.errors += start <= sent <= end or start <= finished <= end
            continue
        if start <= finished <= end:
            point.requests += 1
            point.tokens += reqs.costs[i]
        if start <= sent <= end:
            point.latencies_ms.append((finished - sent) * 1e3)
            if reqs.sizes[i] == 1:
                point.single_ms.append((finished - sent) * 1e3)
    return point
