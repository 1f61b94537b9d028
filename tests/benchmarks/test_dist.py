"""``python -m benchmarks dist``: the push router's policies, the mixed workload, the report.

The benchmark itself (real model, nats-server, many processes) is not run here.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from benchmarks import dist_mixed as mixed
from benchmarks.dist_fleet import flags, scrape_async
from benchmarks.dist_measure import knees, put_back_rows
from benchmarks.dist_push import PushQueue
from benchmarks.dist_report import markdown, write
from fleetserve.queue import MemoryQueue, PendingReply
from fleetserve.wire import Encoding, Envelope, Reply, Task

MODEL = "m/a"
REAL = "sentence-transformers/all-MiniLM-L6-v2"


def env() -> Envelope:
    return Envelope(
        request_id=uuid.uuid4().hex,
        model=MODEL,
        task=Task.EMBEDDINGS,
        content_type=Encoding.JSON,
        accept=Encoding.JSON,
        cost_hint=1,
        deadline=time.time() + 30,
    )


def depths(queues: list[MemoryQueue]) -> list[int]:
    return [q.depth(MODEL) for q in queues]


async def answer(q: MemoryQueue) -> None:
    """The worker side: take the oldest request on ``q`` and reply to it."""
    (msg,) = await q.pull([MODEL], budget=1, timeout=1)
    await q.reply(msg, Reply(b"ok"))
    await q.ack(msg)


async def test_round_robin_cycles_whatever_is_outstanding() -> None:
    queues = [MemoryQueue() for _ in range(3)]
    push = PushQueue(queues, "rr")
    for _ in range(7):
        await push.publish(env(), b"{}")
    assert depths(queues) == [3, 2, 2]
    assert push.outstanding == [3, 2, 2]
    assert push.sent == [3, 2, 2]


async def test_least_outstanding_picks_the_min_and_counts_completions() -> None:
    queues = [MemoryQueue() for _ in range(3)]
    push = PushQueue(queues, "lor")
    p: list[PendingReply] = [await push.publish(env(), b"{}") for _ in range(3)]
    assert push.outstanding == [1, 1, 1]  # ties go round-robin
    await answer(queues[1])
    assert (await p[1].wait(1)).body == b"ok"
    assert push.outstanding == [1, 0, 1]
    await push.publish(env(), b"{}")  # the min: worker 1
    assert depths(queues) == [1, 1, 1]
    assert push.outstanding == [1, 1, 1]
    p[0].cancel()  # the gateway gave up: no longer outstanding, counted once
    p[0].cancel()
    assert push.outstanding == [0, 1, 1]
    await push.publish(env(), b"{}")
    assert depths(queues) == [2, 1, 1]
    assert push.healthy


async def test_a_failed_publish_is_not_outstanding() -> None:
    full = MemoryQueue(max_depth=0)
    push = PushQueue([full, MemoryQueue()], "lor")
    with pytest.raises(Exception, match="full"):
        await push.publish(env(), b"{}")
    assert push.outstanding == [0, 0]


def test_push_queue_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PushQueue([], "rr")
    with pytest.raises(ValueError, match="policy"):
        PushQueue([MemoryQueue()], "random")


def test_mixed_lengths_are_seeded_and_in_range() -> None:
    a = mixed.make_lengths(3000, seed=7)
    assert a == mixed.make_lengths(3000, seed=7)
    assert a != mixed.make_lengths(3000, seed=8)
    sizes = [len(r) for r in a]
    assert min(sizes) == 1 and max(sizes) <= 256
    assert 0.6 < sizes.count(1) / len(sizes) < 0.8  # most requests are one item
    assert sum(s > 32 for s in sizes) > 0  # and there is a bulk tail
    items = [n for r in a for n in r]
    assert min(items) >= 8 and max(items) <= 512
    assert any(n > 256 for n in items)
    assert mixed.tokens([[8, 300, 512]], cap=256) == [8 + 256 + 256]


def test_mixed_texts_have_the_drawn_token_counts() -> None:
    from tokenizers import Tokenizer

    from fleetserve.assembly import HF_CACHE
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve

    spec = Catalog.load().get(REAL)
    path = resolve(spec.id, spec.sources, HF_CACHE)
    lengths = mixed.make_lengths(40, seed=1)
    texts = mixed.texts(lengths, mixed.single_token_words(path), seed=1)
    assert texts == mixed.texts(lengths, mixed.single_token_words(path), seed=1)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    for req, items in zip(lengths, texts, strict=True):
        assert [len(tok.encode(t).ids) for t in items] == req
    (body,) = mixed.bodies(spec.id, [texts[0]])
    assert json.loads(body) == {"model": spec.id, "input": texts[0], "encoding_format": "base64"}


def test_flags_are_checked_by_settings() -> None:
    assert flags({"port": 81, "queue_prefix": "p"}) == ["--port", "81", "--queue-prefix", "p"]
    with pytest.raises(ValueError, match="unknown"):
        flags({"no_such_setting": 1})


def fake_result() -> dict[str, Any]:
    sweep = [
        {
            "mode": m,
            "concurrency": c,
            "tokens_per_s": t,
            "p50_ms": 10.0 * c,
            "p99_ms": 50.0 * c,
            "single_p99_ms": 5.0 * c,
        }
        for m, k in (("pull", 1.0), ("push-rr", 0.8), ("push-lor", 0.9))
        for c, t in ((1, 1000 * k), (2, 1900 * k), (4, 2000 * k))
    ]
    uniform = [
        {"target": "embedded", "tokens_per_s": 100.0, "vs_embedded": 1.0, "p50_ms": 10.0,
         "p99_ms": 12.0, "p50_over_embedded_ms": 0.0, "min_cos": 1.0},
        {"target": "nats", "tokens_per_s": 95.0, "vs_embedded": 0.95, "p50_ms": 12.0,
         "p99_ms": 15.0, "p50_over_embedded_ms": 2.0, "min_cos": 0.999999},
    ]  # fmt: skip
    snaps = [
        {"pull": {"requests": 0.0, "put_backs": 0.0, "redeliveries": 0.0}},
        {"pull": {"requests": 2000.0, "put_backs": 3.0, "redeliveries": 3.0}},
    ]
    return {
        "uniform": uniform,
        "sweep": sweep,
        "knees": knees(sweep),
        "put_backs": put_back_rows(snaps, ["mixed"]),
        "workload": {
            "single_item_share": 0.7,
            "mean_items": 9.1,
            "mean_tokens_per_request": 929.0,
            "max_items": 256,
            "item_tokens": [8, 512],
            "max_seq_len": 256,
        },
        "seconds": 1.0,
        "noise": {
            "others_cores_median": 0.1,
            "others_cores_max": 1.5,
            "noisy_share": 0.25,
            "waited_s": 12.0,
        },
        "machine": {"summary": "Test CPU, 2 cores", "cores": 2, "cpu": "Test CPU"},
        "args": {
            "rounds": 1,
            "concurrency": 4,
            "batch": 32,
            "seed": 0,
            "sweep_rounds": 1,
            "sweep_duration": 1.0,
        },
    }


def test_knee_is_where_throughput_stops_rising() -> None:
    (pull, *_) = knees(fake_result()["sweep"])
    assert (pull["mode"], pull["knee_clients"], pull["knee_tokens_per_s"]) == ("pull", 2, 1900)
    assert (pull["max_tokens_per_s"], pull["top_p99_ms"]) == (2000, 200)


def test_report_writes_markdown_json_and_png(tmp_path: Path) -> None:
    result = fake_result()
    assert result["put_backs"][0]["put_backs_per_1000"] == pytest.approx(1.5)
    write(tmp_path, "dist", result, Console(quiet=True))
    md = (tmp_path / "dist.md").read_text()
    assert "| nats | 95 | 0.95 | 12.00 | 15.00 | +2.00 | 0.999999 |" in md
    assert "p50 +2.00 ms over embedded (target <= +3 ms: met)" in md
    assert "| push-rr | 2 | 1,520 |" in md
    assert "| pull | mixed | 2,000 | 3 | 1.5 |" in md
    assert "median 0.10 cores, max 1.50" in md
    assert json.loads((tmp_path / "dist.json").read_text())["knees"][0]["knee_clients"] == 2
    assert (tmp_path / "dist.png").read_bytes()[:4] == b"\x89PNG"
    assert markdown(result) + "\n" == md


def test_cpu_meter_reads_proc_or_stays_inert() -> None:
    import os

    from benchmarks.dist_cpu import CpuMeter

    meter = CpuMeter(lambda: [os.getpid()])
    a = meter.sample()
    sum(i * i for i in range(200_000))
    load = meter.between(a, meter.sample())
    assert all(v >= 0 for v in load.values())
    assert meter.wait_quiet(limit=0.0, every=0.01) < 5


async def test_closed_loop_counts_the_window_only() -> None:
    import asyncio

    import httpx

    async def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text='fleetserve_tokens_total{model="m"} 7.0\n')
        await asyncio.sleep(0.02)
        return httpx.Response(500 if request.content == b"bad" else 200)

    point = mixed.Point("pull", concurrency=2, round=0, seconds=0.4)
    reqs = mixed.Requests([b"a", b"b", b"bad"], costs=[10, 20, 0], sizes=[1, 5, 1])
    await mixed.closed_loop(
        "http://x/", reqs, point, warm=0.1, transport=httpx.MockTransport(server)
    )
    assert 10 <= point.requests <= 40  # about 2 clients x 0.4 s / 20 ms, two thirds good
    assert point.errors >= point.requests // 4
    assert 10 * point.requests <= point.tokens <= 20 * point.requests
    assert all(15 < x < 200 for x in point.latencies_ms)
    assert 0 < len(point.single_ms) < len(point.latencies_ms)
    assert point.tokens_per_s == point.tokens / 0.4

    async def read(client: httpx.AsyncClient) -> float:
        return await scrape_async(client, "http://x", "fleetserve_tokens_total")

    point = mixed.Point("pull", concurrency=1, round=0, seconds=0.1)
    await mixed.closed_loop(
        "http://x/", reqs, point, warm=0.0, server_tokens=read,
        transport=httpx.MockTransport(server),
    )  # fmt: skip
    assert point.server_tokens == 0.0  # the counter did not move
    assert point.tokens_per_s == 0.0
