"""Failure tests with real processes: nothing accepted is lost, nothing is mixed up."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fleetserve.sdk import AsyncClient

from ..conftest import TINY
from ..waiting import async_wait_for, wait_for
from .conftest import POISON, RunningCluster, start_cluster


def reference(model_dir: Path, texts: list[str]) -> np.ndarray[Any, Any]:
    """The same embeddings computed directly with transformers, no fleetserve."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), 64):
            enc = tok(texts[i : i + 64], padding=True, truncation=True, max_length=16,
                      return_tensors="pt")  # fmt: skip
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.concatenate(out)


async def _encode_all(
    api: str, texts: list[str], answered: list[Any] | None = None, **client: Any
) -> list[Any]:
    """Every text's embedding (or its error); each is appended to ``answered`` too."""
    answered = [] if answered is None else answered
    async with AsyncClient(api, timeout=60, **client) as c:
        sem = asyncio.Semaphore(600)

        async def one(t: str) -> Any:
            async with sem:
                try:
                    answered.append((await c.encode(TINY, [t]))[0])
                except Exception as exc:
                    answered.append(exc)
                return answered[-1]

        return await asyncio.gather(*(one(t) for t in texts))


def _check(results: list[Any], texts: list[str], model_dir: Path) -> None:
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, f"{len(errors)} failed, first: {errors[0]!r}"
    got = np.stack(results)
    want = reference(model_dir, texts)
    cos = (got * want).sum(1)
    assert cos.min() > 0.999, f"request {int(cos.argmin())} got another request's result"


def test_kill_a_worker_mid_load_loses_nothing(
    running: RunningCluster, cluster_catalog: Path
) -> None:
    texts = [f"sentence number {i} about {i % 7} things" for i in range(600)]

    async def scenario() -> list[Any]:
        answered: list[Any] = []
        task = asyncio.create_task(_encode_all(running.api, texts, answered))
        await async_wait_for(lambda: len(answered) >= 20, 30, "the load to flow")
        running.kill_worker(0)
        assert len(answered) < len(texts), "the worker was not killed mid-load"
        return await task

    t0 = time.monotonic()
    results = asyncio.run(scenario())
    _check(results, texts, cluster_catalog.parent / "model")
    assert time.monotonic() - t0 < 60


def test_restart_nats_under_load_recovers(cluster_catalog: Path, tmp_path: Path) -> None:
    rc = start_cluster(cluster_catalog, tmp_path, workers=1, stream_storage="file")
    try:
        texts = [f"restart case {i}" for i in range(300)]

        async def scenario() -> list[Any]:
            answered: list[Any] = []
            task = asyncio.create_task(_encode_all(rc.api, texts, answered, max_retries=20))
            await async_wait_for(lambda: len(answered) >= 20, 30, "the load to flow")
            rc.cluster.nats.kill()
            assert len(answered) < len(texts), "the broker was not killed mid-load"
            async with httpx.AsyncClient() as http:  # the gateway sees the broker gone

                async def unready() -> bool:
                    return (await http.get(rc.api + "/readyz")).status_code == 503

                await async_wait_for(unready, 10, "the gateway to see the broker gone")
            rc.cluster.nats.start()  # same port, same store
            return await task

        results = asyncio.run(scenario())
        _check(results, texts, cluster_catalog.parent / "model")
        assert wait_for(lambda: httpx.get(rc.api + "/readyz").status_code == 200)
    finally:
        rc.cluster.stop()


def test_readyz_follows_the_nats_connection(running: RunningCluster) -> None:
    assert httpx.get(running.api + "/readyz").status_code == 200
    running.cluster.nats.kill()
    assert wait_for(lambda: httpx.get(running.api + "/readyz").status_code == 503)
    r = httpx.post(running.api + f"/v1/encode/{TINY}", json={"inputs": ["x"]})
    assert r.status_code == 503 and "retry-after" in r.headers
    running.cluster.nats.start()
    assert wait_for(lambda: httpx.get(running.api + "/readyz").status_code == 200, 15)


def test_deadline_is_504_and_the_worker_skips_the_expired_work(running: RunningCluster) -> None:
    pids = [w.pid for w in running.cluster.workers]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        r = httpx.post(
            running.api + f"/v1/encode/{TINY}",
            json={"inputs": ["too late"]},
            headers={"x-request-timeout": "0.3"},
        )
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "deadline_exceeded"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert wait_for(lambda: running.worker_metric("fleetserve_expired_total") >= 1, 10)
    ok = httpx.post(running.api + f"/v1/encode/{TINY}", json={"inputs": ["fine"]})
    assert ok.status_code == 200


def test_poison_request_is_dead_lettered_and_others_are_served(
    running: RunningCluster,
) -> None:
    long = " ".join(["word"] * 40)  # more positions than the model has: it raises every time
    r = httpx.post(running.api + f"/v1/encode/{POISON}", json={"inputs": [long]}, timeout=30)
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["code"] == "internal_error" and "inference failed" in err["message"]
    ok = httpx.post(running.api + f"/v1/encode/{POISON}", json={"inputs": ["short"]})
    assert ok.status_code == 200
    assert wait_for(lambda: running.worker_metric("fleetserve_dead_letters") == 1, 5)
    assert running.worker_metric("fleetserve_retries_total") == 2  # max_deliver=3

    from fleetserve.cli import main

    settings_args = ["--nats", running.cluster.nats.url,
                     "--queue-prefix", running.cluster.settings.queue_prefix]  # fmt: skip
    assert main(["dlq", "list", *settings_args]) == 0


@pytest.mark.parametrize("bad", ["nats://127.0.0.1:9"])
def test_unreachable_nats_at_start_is_a_clear_error(
    bad: str, capfd: pytest.CaptureFixture[str]
) -> None:
    from fleetserve.cli import main

    rc = main(["gateway", "--nats", bad, "--nats-connect-timeout", "0.5", "--port", "0"])
    assert rc == 1
    err = capfd.readouterr().err
    assert "cannot reach NATS" in err and "Traceback" not in err
