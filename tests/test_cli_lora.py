"""``fleetserve lora add|list|rm`` through the SDK against the ``/v1/adapters`` routes,
and the SDK's adapter methods, sync and async; the table fits 80 columns."""

from __future__ import annotations

import asyncio
import importlib
import io
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

import fleetserve.sdk
from fleetserve import AsyncClient, Client, cli_lora
from fleetserve.cli import main
from fleetserve.gateway.adapter_routes import AdapterRoutes
from fleetserve.lora.store import AdapterStore
from fleetserve.storage import MemoryStore
from fleetserve.wire import AdapterNotFound, Forbidden, InvalidInput
from fleetserve.wire.finetune import Job, JobStatus

from .gateway.finetune_kit import ALICE as ALICE_KEY
from .gateway.finetune_kit import (
    DENSE,
    RESULT,
    Served,
    finish,
    pairs,
    run_steps,
    served_fixture,  # noqa: F401
)
from .lora.kit import ALICE, BASE, READER, Kit, kit_fixture, registry_on  # noqa: F401


def asgi_app(kit: Kit) -> Any:
    routes = AdapterRoutes(registry_on(AdapterStore(MemoryStore()), kit))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        bearer = dict(scope["headers"]).get(b"authorization", b"")
        await routes(scope, receive, send, READER if bearer == b"Bearer reader" else ALICE)

    return app


def sync_transport(app: Any) -> httpx.MockTransport:
    """The ASGI app behind a sync client: each request runs on a loop of its own."""

    def handle(request: httpx.Request) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport) as c:
                r = await c.request(
                    request.method,
                    str(request.url),
                    headers=request.headers,
                    content=request.read(),
                )
            return httpx.Response(r.status_code, headers=r.headers, content=r.content)

        return asyncio.run(go())

    return httpx.MockTransport(handle)


@pytest.fixture
def server(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> httpx.MockTransport:
    transport = sync_transport(asgi_app(kit))
    real = fleetserve.sdk.Client
    # a module that binds the name at import keeps what it found then: imported first,
    # it keeps the real Client (cli_add, imported while this patch held, kept the fake
    # for the rest of the process, and a later test's `fleetserve add --server` used it)
    importlib.import_module("fleetserve.cli_add")

    def client(url: str, **kwargs: Any) -> Client:
        assert url == "http://adapters.test"
        return real(url, transport=transport, **kwargs)

    monkeypatch.setattr(fleetserve.sdk, "Client", client)
    return transport


def test_add_list_rm(
    server: httpx.MockTransport, kit: Kit, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", "http://adapters.test"]
    assert main(["lora", "add", str(kit.lora.dir), "--name", "legal-v1", "--base", BASE, *url]) == 0
    out = capsys.readouterr().out
    assert "added alice/legal-v1@1 for tiny/bert" in out and "tiny/bert:alice/legal-v1@1" in out
    assert main(["lora", "add", str(kit.lora2.dir), "--name", "legal-v1", "--pinned", *url]) == 0
    capsys.readouterr()
    assert main(["lora", "list", *url]) == 0  # piped: tab-separated, nothing folded
    header, *rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert header == ["adapter", "base", "rank", "bytes", "sha256", "pinned"]
    assert [(r[0], r[1], r[5]) for r in rows] == [
        ("alice/legal-v1@1", BASE, ""), ("alice/legal-v1@2", BASE, "yes")
    ]  # fmt: skip
    assert all(len(r[4]) == 64 for r in rows)
    from fleetserve.cli_lora import print_table

    with fleetserve.sdk.Client("http://adapters.test") as c:  # the fixture's transport
        listed = c.list_adapters()
    for width in (80, 120):  # a terminal: within its width, the base on one line at 120
        out = io.StringIO()
        print_table(Console(file=out, width=width, force_terminal=True, color_system=None),
                    listed, "http://adapters.test")  # fmt: skip
        lines = out.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width, out.getvalue()
        assert (BASE in out.getvalue()) or width == 80
    assert main(["lora", "rm", "alice/legal-v1@1", *url]) == 0
    assert "deleted alice/legal-v1@1" in capsys.readouterr().out
    assert main(["lora", "rm", "alice/legal-v1@1", *url]) == 1
    assert "no adapter alice/legal-v1@1 (adapter_not_found)" in capsys.readouterr().out
    assert main(["lora", "add", str(kit.work), "--name", "x", *url]) == 1
    said = " ".join(capsys.readouterr().out.split())  # wrapped at 80 columns where it falls
    assert f"{kit.work} has no adapter_config.json" in said


def test_the_sync_sdk(server: httpx.MockTransport, kit: Kit, tmp_path: Path) -> None:
    with Client("http://adapters.test", transport=server) as c:
        info = c.upload_adapter(kit.lora.dir / "adapter_model.safetensors", "a", base=BASE)
        assert info["id"] == "alice/a@1"
        assert c.upload_adapter(kit.lora.dir, "a", version=4)["id"] == "alice/a@4"
        assert [a["id"] for a in c.list_adapters()] == ["alice/a@1", "alice/a@4"]
        assert c.list_adapters(base="x/y") == []
        assert c.get_adapter("alice/a")["version"] == 4
        assert c.delete_adapter("alice/a") == ["alice/a@1", "alice/a@4"]
        with pytest.raises(AdapterNotFound, match="alice/a"):
            c.get_adapter("alice/a")
        pickled = tmp_path / "pickled"
        pickled.mkdir()
        (pickled / "adapter_config.json").write_bytes(kit.lora.config)
        (pickled / "adapter_model.bin").write_bytes(b"\x80\x04.")
        with pytest.raises(InvalidInput, match=r"adapter_model\.bin: pickled"):
            c.upload_adapter(pickled, "p")
    with (
        Client("http://adapters.test", transport=server, api_key="reader") as c,
        pytest.raises(Forbidden),
    ):
        c.upload_adapter(kit.lora.dir, "a")


async def test_the_async_sdk(kit: Kit) -> None:
    transport = httpx.ASGITransport(app=asgi_app(kit))
    async with AsyncClient("http://t", transport=transport) as c:
        info = await c.upload_adapter(kit.lora.dir, "b", base=BASE, pinned=True)
        assert info["id"] == "alice/b@1" and info["pinned"]
        assert [a["id"] for a in await c.list_adapters(BASE)] == ["alice/b@1"]
        assert (await c.get_adapter("alice/b@1"))["sha256"] == info["sha256"]
        assert await c.delete_adapter("alice/b@1") == ["alice/b@1"]


def test_native_calls_send_the_adapter_field() -> None:
    sent: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        import msgspec

        sent.append(msgspec.msgpack.decode(request.content))
        return httpx.Response(
            200,
            headers={"content-type": "application/msgpack"},
            content=msgspec.msgpack.encode({"scores": [0.5], "results": [[]]}),
        )

    with Client("http://t", transport=httpx.MockTransport(handle)) as c:
        c.score("m", "q", ["a"], adapter="alice/x@2")
        c.extract("m", "text", adapter="alice/x")
        c.score("m", "q", ["a"])
    assert sent[0]["adapter"] == "alice/x@2" and sent[1]["adapter"] == "alice/x"
    assert "adapter" not in sent[2]


# -- lora train: a job the test moves through the store while the CLI follows it ---------


def trainer(served: Served, then: Callable[[Job], Awaitable[Any]]) -> threading.Thread:
    """Once the CLI has created its job: ``then(job)`` on the server's loop."""

    def run() -> None:
        deadline = time.monotonic() + 10
        while not (jobs := [j for j in served.call(lambda: served.store.jobs("alice"))
                            if not j.status.finished]):  # fmt: skip
            assert time.monotonic() < deadline, "no job was created"
            time.sleep(0.01)
        served.call(lambda: then(jobs[0]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def train_args(served: Served, path: Path, *extra: str) -> list[str]:
    path.write_bytes(pairs(6))
    return ["lora", "train", "--model", DENSE, "--pairs", str(path), "--url", served.url,
            "--api-key", ALICE_KEY, *extra]  # fmt: skip


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_lora, "POLL", 0.01)


def test_train_follows_the_job_to_its_figures(
    served: Served, fast: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def succeed(job: Job) -> None:
        job = await run_steps(served.store, job, 4)
        await finish(served.store, job, JobStatus.SUCCEEDED, result=RESULT,
                     fine_tuned_model=f"{DENSE}:alice/legal@1")  # fmt: skip

    thread = trainer(served, succeed)
    args = train_args(served, tmp_path / "train.jsonl", "--suffix", "legal", "--rank", "4",
                      "--epochs", "2", "--learning-rate", "0.0005", "--margin", "0.02")  # fmt: skip
    assert main(args) == 0
    thread.join(10)
    out = capsys.readouterr().out
    assert "uploaded train.jsonl as file-" in out and ": 6 pairs" in out
    assert "created job ftjob-" in out and f"on {DENSE}, suffix legal" in out
    assert "  rank 4, alpha 8, epochs 2, lr 0.0005, batch 32, hard negatives 0\n" in out
    assert "training started" in out and "job succeeded" in out and "step 1/4" not in out
    assert "4/4" in out  # the bar, at its end
    table = out[out.index("nDCG@10") :]
    assert "0.5000" in table and "0.7500" in table and "+0.2500" in table
    assert "recall@10" in table and "+0.2000" in table
    assert "registered (trained in 12.5 s); call it as model" in out
    assert f"{DENSE}:alice/legal@1" in out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    [job] = served.call(lambda: served.store.jobs("alice"))
    assert job.margin == 0.02 and job.hyperparameters.learning_rate == 0.0005


def test_train_exit_codes(
    served: Served, fast: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fail(job: Job) -> None:
        error = {"code": "training_failed", "message": "training failed: out of memory"}
        await finish(served.store, job, JobStatus.FAILED, error=error)

    thread = trainer(served, fail)
    assert main(train_args(served, tmp_path / "a.jsonl")) == 1
    thread.join(10)
    out = capsys.readouterr().out
    assert "job failed: training failed: out of memory" in out and "nDCG@10" not in out

    async def below(job: Job) -> None:
        result = {**RESULT, "gain": 0.004, "registered": False, "adapter_id": None}
        await finish(served.store, job, JobStatus.SUCCEEDED, result=result)

    thread = trainer(served, below)
    assert main(train_args(served, tmp_path / "b.jsonl")) == 0
    thread.join(10)
    out = capsys.readouterr().out
    assert "not registered: the nDCG@10 gain +0.0040 is below the margin +0.0100" in out
    assert "trained in 12.5 s" in out


def test_train_detach_bad_files_and_ctrl_c(
    served: Served,
    fast: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert main(train_args(served, tmp_path / "a.jsonl", "--detach")) == 0
    out = capsys.readouterr().out
    assert "detached" in out
    [job] = served.call(lambda: served.store.jobs("alice"))
    assert job.status is JobStatus.QUEUED
    bad = tmp_path / "bad.jsonl"
    args = train_args(served, tmp_path / "b.jsonl")
    bad.write_bytes(b'{"query": "q"}\n')
    assert main([*args[:5], str(bad), *args[6:]]) == 1
    assert "line 1 has no 'positive'" in capsys.readouterr().out
    args = train_args(served, tmp_path / "c.jsonl", "--rank", "999")
    assert main(args) == 1
    assert "hyperparameters.rank must be between 1 and 64" in capsys.readouterr().out

    # Ctrl-C while following (raised where following waits: no signal to race with
    # the server's threads): the job is cancelled, exit 130
    def follow(*a: Any) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_lora, "follow", follow)
    assert main(train_args(served, tmp_path / "d.jsonl")) == 130
    out = capsys.readouterr().out
    assert "interrupted: job ftjob-" in out and "is cancelled" in out
    statuses = {j.status for j in served.call(lambda: served.store.jobs("alice"))}
    assert JobStatus.CANCELLED in statuses


def test_train_truncate(
    served: Served, fast: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Today a text over train_max_chars is kept and the CLI has no --truncate: here the
    file is refused naming the line, and --truncate uploads it with the text cut."""
    args = train_args(served, tmp_path / "a.jsonl", "--detach")
    long = tmp_path / "long.jsonl"
    long.write_bytes(pairs(6) + b'{"query": "q", "positive": "' + b"x" * 2100 + b'"}\n')
    args[5] = str(long)
    assert main(args) == 1
    assert "line 7 positive is 2,100 characters" in capsys.readouterr().out
    assert main([*args, "--truncate"]) == 0
    out = capsys.readouterr().out
    assert "7 pairs" in out and "detached" in out
