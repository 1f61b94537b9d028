"""Uploads stream to disk (issue 22, findings 4 and 5): an upload cut off by a hang-up
or missing its closing boundary is discarded and logged, a safetensors header over
its limit is refused from its first bytes, a large adapter costs the server little
memory while /healthz keeps answering, and concurrent uploads are bounded."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetserve.gateway.adapter_routes import AdapterRoutes
from fleetserve.gateway.finetune import FineTuneRoutes
from fleetserve.gateway.multipart import Start, StreamParser, parse
from fleetserve.gateway.upload import Uploads
from fleetserve.lora.store import AdapterStore
from fleetserve.storage import MemoryStore
from fleetserve.wire import Principal

from .. import forked
from ..lora.kit import ALICE, BASE, BOB, Kit, kit_fixture, registry_on  # noqa: F401
from .finetune_kit import ALICE as ALICE_KEY
from .finetune_kit import Served, finetuning, pairs
from .upload_kit import (
    Multipart,
    PairsFile,
    adapter_body,
    peak_while,
    post,
    reset_peak,
    status_kib,
)

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


# -- ASGI helpers ---------------------------------------------------------------------
def scope_of(path: str, content_type: str, length: int | None) -> dict[str, Any]:
    headers = [(b"content-type", content_type.encode())]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": "POST", "path": path, "headers": headers}


async def call(
    app: Any, scope: dict[str, Any], chunks: list[bytes], principal: Principal,
    *, hang_up: bool = False, gate: asyncio.Event | None = None,
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """Run one request through ``app``: the body in ``chunks``, then (``hang_up``) a
    disconnect instead of its end; ``gate`` holds the body until it is set."""
    queue = list(chunks)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if gate is not None:
            await gate.wait()
        if queue:
            chunk = queue.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(queue) or hang_up}
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    await app(scope, receive, send, principal)
    return sent[0]["status"], json.loads(sent[1]["body"])


def multipart_bytes(kit: Kit, *, closing: bool = True) -> tuple[bytes, str]:
    body = (
        Multipart()
        .field("name", "legal")
        .field("base", BASE)
        .file("files", "adapter_config.json", [kit.lora.config], len(kit.lora.config))
        .file("files", "adapter_model.safetensors", [kit.lora.weights], len(kit.lora.weights))
    )
    raw = b"".join(body)
    return (raw if closing else raw[: -len(body.closing())]), body.content_type


@pytest.fixture
def adapters(kit: Kit, tmp_path: Path) -> tuple[AdapterRoutes, AdapterStore, Path]:
    store = AdapterStore(MemoryStore())
    spool = tmp_path / "uploads"
    routes = AdapterRoutes(registry_on(store, kit), uploads=Uploads(spool))
    return routes, store, spool


def spooled(root: Path) -> list[Path]:
    return list(root.glob("*")) if root.exists() else []


# -- cut off, or without a closing boundary: discarded, logged --------------------------
async def test_adapter_upload_cut_off_is_discarded_and_logged(
    adapters: tuple[AdapterRoutes, AdapterStore, Path], kit: Kit, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: read_body stopped at http.disconnect and returned the part it had, which
    was then parsed (400 at best, a stored partial file at worst), logged as if the
    client had been answered; now: 499, 'upload cut off after N of M bytes' in the log,
    nothing spooled or stored."""
    routes, store, spool = adapters
    raw, ctype = multipart_bytes(kit)
    half = raw[: len(raw) // 2]
    caplog.set_level(logging.WARNING, logger="fleetserve.gateway")
    status, body = await call(
        routes, scope_of("/v1/adapters", ctype, len(raw)), [half], ALICE, hang_up=True
    )
    assert status == 499 and body["error"]["code"] == "cancelled"
    assert f"upload cut off after {len(half)} of {len(raw)} bytes" in body["error"]["message"]
    assert any("upload cut off after" in r.getMessage() for r in caplog.records)
    assert await store.keys("adapters/") == [] and spooled(spool) == []
    # the same upload, whole, is stored: the cut-off one left nothing in its way
    status, body = await call(routes, scope_of("/v1/adapters", ctype, len(raw)), [raw], ALICE)
    assert status == 201, body
    assert spooled(spool) == []


async def test_multipart_without_closing_boundary_is_discarded(
    adapters: tuple[AdapterRoutes, AdapterStore, Path],
    kit: Kit,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A body that ends (Content-Length met) before its closing boundary is refused
    with a 400, logged as cut off, and leaves nothing: no spool file, no adapter, no
    training file. Before, it was refused but not logged as cut off."""
    routes, store, spool = adapters
    caplog.set_level(logging.WARNING, logger="fleetserve.gateway")
    raw, ctype = multipart_bytes(kit, closing=False)
    status, body = await call(routes, scope_of("/v1/adapters", ctype, len(raw)), [raw], ALICE)
    assert status == 400 and "cut short" in body["error"]["message"]
    assert await store.keys("adapters/") == [] and spooled(spool) == []
    cut_off = f"upload cut off: a multipart body of {len(raw)} bytes has no closing boundary"
    assert [r.getMessage() for r in caplog.records] == [cut_off]
    ft = finetuning()
    files = FineTuneRoutes(ft, max_file_bytes=MiB, uploads=Uploads(tmp_path / "ft"))
    form = (
        Multipart().field("purpose", "fine-tune").file("file", "p.jsonl", [pairs(8)], len(pairs(8)))
    )
    cut = b"".join(form)[: -len(form.closing())]
    status, body = await call(
        files, scope_of("/v1/files", form.content_type, len(cut)), [cut], ALICE
    )
    assert status == 400 and "cut short" in body["error"]["message"]
    assert await ft.store.files("alice") == [] and spooled(tmp_path / "ft") == []


async def test_a_deeply_nested_config_is_a_400(
    adapters: tuple[AdapterRoutes, AdapterStore, Path], kit: Kit
) -> None:
    """An adapter_config.json of 200,000 '[' (within its 1 MiB) made json.loads raise
    RecursionError, which nothing caught: a 500; now a 400 naming the file."""
    routes, store, spool = adapters
    deep = b"[" * 200_000
    form = (
        Multipart()
        .field("name", "deep")
        .field("base", BASE)
        .file("files", "adapter_config.json", [deep], len(deep))
        .file("files", "adapter_model.safetensors", [kit.lora.weights], len(kit.lora.weights))
    )
    raw = b"".join(form)
    status, body = await call(
        routes, scope_of("/v1/adapters", form.content_type, len(raw)), [raw], ALICE
    )
    assert status == 400 and "nested too deeply" in body["error"]["message"]
    assert body["error"]["field"] == "config" and spooled(spool) == []
    assert await store.keys("adapters/") == []


def test_cut_off_file_upload_over_a_socket_is_not_stored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 5: declare 1000 rows in Content-Length, send 40, close. Before: a 40-row
    file was stored and logged as 200; now nothing is stored, the log says the upload
    was cut off after the bytes sent of the bytes declared, and its access line 499."""
    srv = Served(tmp_path / "tune")
    srv.app.finetune = FineTuneRoutes(srv.ft, max_file_bytes=MiB, uploads=Uploads(tmp_path / "up"))
    caplog.set_level(logging.WARNING, logger="fleetserve.gateway")
    caplog.set_level(logging.INFO, logger="fleetserve.access")
    srv.start()
    try:
        whole, part = pairs(1000, queries=50), pairs(40, queries=10)
        head = (
            f"POST /v1/files?filename=p.jsonl HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"authorization: Bearer {ALICE_KEY}\r\ncontent-type: application/jsonl\r\n"
            f"content-length: {len(whole)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(head + part)
        want = f"upload cut off after {len(part)} of {len(whole)} bytes"

        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records]

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the server notices the hang-up on its loop
            if any(m.startswith("POST /v1/files ") for m in logged()):  # the access line
                break
            time.sleep(0.02)
        assert any(want in m for m in logged()), logged()
        access = [m for m in logged() if m.startswith("POST /v1/files ")]
        assert len(access) == 1 and access[0].startswith("POST /v1/files 499 ")
        assert srv.call(lambda: srv.store.files("alice")) == []
        assert spooled(tmp_path / "up") == []
    finally:
        srv.stop()


# -- concurrent uploads: bounded per tenant (429) and overall (503) ---------------------
async def test_concurrent_uploads_are_bounded(kit: Kit, tmp_path: Path) -> None:
    """Before: any number of uploads were received at once (50 OOM-killed the server);
    now a tenant's third concurrent upload gets 429 and the server's fourth 503, both
    with Retry-After, and the held ones still succeed."""
    store = AdapterStore(MemoryStore())
    uploads = Uploads(tmp_path / "up", total=3, per_tenant=2, retry_after=2.0)
    routes = AdapterRoutes(registry_on(store, kit), uploads=uploads)
    gate = asyncio.Event()
    held = []
    for who, name in ((ALICE, "a1"), (ALICE, "a2"), (BOB, "b1")):
        raw, ctype = multipart_bytes(kit)
        raw = raw.replace(b"\r\n\r\nlegal\r\n", f"\r\n\r\n{name}\r\n".encode())
        scope = scope_of("/v1/adapters", ctype, len(raw))
        held.append(asyncio.create_task(call(routes, scope, [raw], who, gate=gate)))
    while uploads.active < 3:  # each has taken its slot and waits for its body
        await asyncio.sleep(0)
    raw, ctype = multipart_bytes(kit)
    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    async def never() -> dict[str, Any]:
        raise AssertionError("a refused upload's body is not read")

    await routes(scope_of("/v1/adapters", ctype, len(raw)), never, send, ALICE)
    assert sent[0]["status"] == 429 and (b"retry-after", b"2") in sent[0]["headers"]
    assert "max_uploads_per_tenant" in json.loads(sent[1]["body"])["error"]["message"]
    sent.clear()
    await routes(scope_of("/v1/adapters", ctype, len(raw)), never, send, BOB)
    assert sent[0]["status"] == 503 and (b"retry-after", b"2") in sent[0]["headers"]
    assert "max_uploads" in json.loads(sent[1]["body"])["error"]["message"]
    gate.set()
    assert [s for s, _ in await asyncio.gather(*held)] == [201, 201, 201]
    assert uploads.active == 0


# -- the streaming multipart parser -----------------------------------------------------
@pytest.mark.parametrize("size", [1, 3, 17, 4096, 1 << 20])
def test_stream_parser_gives_the_parts_in_any_chunking(size: int) -> None:
    """The parser that replaced the whole-body split gives the same parts however the
    body is cut into chunks (a delimiter split across two chunks included)."""
    data = bytes(range(256)) * 40 + b"\r\n--" + b"\r\n-"
    form = Multipart().field("name", "x").file("weights", "w.safetensors", [data], len(data))
    raw = b"".join(form)
    parser, parts, current = StreamParser(form.content_type), [], [b""]
    for i in range(0, len(raw), size):
        for event in parser.feed(raw[i : i + size]):
            if isinstance(event, Start):
                current = [event.name.encode()]
            elif isinstance(event, bytes):
                current.append(event)
            else:
                parts.append((current[0], b"".join(current[1:])))
    parser.close()
    assert parts == [(b"name", b"x"), (b"weights", data)]
    assert [(p.name, p.data) for p in parse(raw, form.content_type)] == [
        ("name", b"x"),
        ("weights", data),
    ]


# -- a gateway in a subprocess: its memory while it takes a large upload ----------------
@pytest.fixture(scope="module")
def big_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    root = tmp_path_factory.mktemp("big-uploads")
    proc = forked.popen(
        [sys.executable, "-m", "tests.gateway.upload_kit", str(root)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline() or 0)
        assert port, "the upload server did not start"
        yield proc.pid, port, root
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        if proc.stdout is not None:
            proc.stdout.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
def test_large_training_file_costs_little_memory(big_server: tuple[int, int, Path]) -> None:
    """A 78 MiB JSONL of 300,000 rows (each tenth a repeat that brings a negative) to
    /v1/files: before, the spooled file was read whole, parsed into pairs held for the
    deduplication and written out again whole (+274 MiB for 66 MiB, measured; +398 MiB
    here); now it is checked a line at a time, each kept row written to a file as it
    is read and moved into the store: peak RSS grows < 100 MiB, /healthz within 1 s."""
    pid, port, root = big_server
    assert post(port, PairsFile(64), "/v1/files")[0] == 200  # imports, first-use caches
    body = PairsFile(300_000)
    (status, info), grew, slowest = peak_while(pid, port, lambda: post(port, body, "/v1/files"))
    assert status == 200, info
    print(f"{len(body) >> 20} MiB file: peak RSS +{grew / 1024:.0f} MiB, /healthz {slowest:.3f} s")
    assert grew < 100 * 1024, f"peak RSS grew {grew / 1024:.0f} MiB"
    assert slowest < 1.0, f"/healthz took {slowest:.2f} s"
    assert info["bytes"] == len(body) and info["duplicates"] == body.duplicates
    assert info["rows"] == body.rows - body.duplicates
    kept = root / f"store/finetune/files/alice/{info['id']}.jsonl"
    with kept.open("rb") as f:
        rows = [json.loads(f.readline()) for _ in range(5)]
    assert [len(r["negative"]) for r in rows] == [1, 1, 1, 1, 2]  # row 9 merged into 4
    assert list((root / "uploads").glob("*")) == []


def test_large_adapter_upload_costs_little_memory(big_server: tuple[int, int, Path]) -> None:
    """Finding 4: a 128 MiB adapter upload used to be held whole, about 3.8 times over
    (+480 MiB); now it is spooled to disk as it arrives, validated from the file and
    renamed into the store: the server's peak RSS grows < 100 MiB, and /healthz
    answers within 1 s meanwhile."""
    pid, port, root = big_server
    assert post(port, adapter_body(2, "warm"))[0] == 201  # imports and first-use caches
    reset_peak(pid)
    before = status_kib(pid, "VmRSS")
    result: list[tuple[int, dict[str, Any]]] = []
    upload = threading.Thread(target=lambda: result.append(post(port, adapter_body(64))))
    upload.start()
    probes: list[float] = []
    health = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while upload.is_alive() and len(probes) < 600:
        t0 = time.perf_counter()
        health.request("GET", "/healthz")
        assert health.getresponse().read() == b'{"status":"ok"}'
        probes.append(time.perf_counter() - t0)
        upload.join(0.05)
    upload.join(120)
    health.close()
    status, info = result[0]
    assert status == 201, info
    grew = status_kib(pid, "VmHWM") - before
    assert grew < 100 * 1024, f"peak RSS grew {grew / 1024:.0f} MiB"
    assert probes and max(probes) < 1.0, f"/healthz took {max(probes):.2f} s"
    stored = root / "store/adapters/alice/big/1/adapter_model.safetensors"
    config = stored.parent / "adapter_config.json"
    assert stored.stat().st_size + config.stat().st_size == info["bytes"]
    assert list((root / "uploads").glob("*")) == []


def test_huge_safetensors_header_is_refused_with_little_memory(
    big_server: tuple[int, int, Path],
) -> None:
    """Finding 4: a safetensors file with a 60 MB JSON header (a million tensor
    entries) took 20 s and +727 MiB before its 400; now its declared length is over
    max_safetensors_header_bytes, which is refused from its first bytes: 400, peak
    RSS < 100 MiB more, nothing kept."""
    pid, port, root = big_server
    entry = b'"t%07d":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
    count = 1_000_000
    size = 2 + count * (len(entry) - 4 + 7) - 1  # "{" ... "}" without the last comma

    def header() -> Iterator[bytes]:
        yield size.to_bytes(8, "little") + b"{"
        batch = 20_000
        for start in range(0, count, batch):
            rows = b"".join(entry % i for i in range(start, min(count, start + batch)))
            yield rows[:-1] if start + batch >= count else rows
        yield b"}"

    cfg = b'{"peft_type": "LORA", "r": 4, "base_model_name_or_path": "big/base"}'
    body = (
        Multipart()
        .field("name", "huge-header")
        .file("files", "adapter_config.json", [cfg], len(cfg))
        .file("files", "adapter_model.safetensors", header(), 8 + size)
    )
    reset_peak(pid)
    before = status_kib(pid, "VmRSS")
    status, err = post(port, body)
    assert status == 400, err
    assert "max_safetensors_header_bytes" in err["error"]["message"]
    grew = status_kib(pid, "VmHWM") - before
    assert grew < 100 * 1024, f"peak RSS grew {grew / 1024:.0f} MiB"
    assert not (root / "store/adapters/alice/huge-header").exists()
    assert list((root / "uploads").glob("*")) == []
