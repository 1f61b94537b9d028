"""What the upload tests share: adapters and multipart bodies made on the fly (a
large safetensors file of zeros is generated chunk by chunk, never held), and a
gateway serving ``/v1/adapters`` in a subprocess of its own, whose memory the tests
read from ``/proc``.

``python -m tests.gateway.upload_kit DIR`` runs that gateway: a file adapter store
under ``DIR``, a fake base (:data:`BIG`) whose Linear layers are 4096x4096, the key
:data:`KEY` (tenant alice); ``/v1/files`` too (into the same store, up to
:data:`MAX_FILE_BYTES`; no trainer); it prints its port and serves until stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

BIG = "big/base"
KEY = "fs-alice-key-for-upload-tests"
WIDTH, RANK = 4096, 64  # each module's lora_A and lora_B: 1 MiB of float32 each
CHUNK = 1 << 20
MAX_FILE_BYTES = 128 << 20  # /v1/files here


def big_shapes(layers: int) -> dict[str, tuple[int, int]]:
    return {f"layers.{i}.proj": (WIDTH, WIDTH) for i in range(layers)}


def config(base: str = BIG, rank: int = RANK) -> bytes:
    return json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": ["proj"],
         "base_model_name_or_path": base}
    ).encode()  # fmt: skip


def safetensors_header(layers: int) -> tuple[bytes, int]:
    """(the 8-byte length and JSON header, the data's length) of a rank-64 adapter on
    ``layers`` of the big base's modules."""
    header: dict[str, object] = {}
    at = 0
    for i in range(layers):
        for ab, shape in (("A", [RANK, WIDTH]), ("B", [WIDTH, RANK])):
            n = RANK * WIDTH * 4
            name = f"base_model.model.layers.{i}.proj.lora_{ab}.weight"
            header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + n]}
            at += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw, at


def zeros(n: int) -> Iterator[bytes]:
    block = bytes(CHUNK)
    while n > 0:
        yield block[: min(n, CHUNK)]
        n -= CHUNK


class Multipart:
    """A multipart/form-data body as a sized iterable of chunks (nothing held whole)."""

    def __init__(self) -> None:
        self.boundary = uuid.uuid4().hex
        self._pieces: list[tuple[bytes, Iterable[bytes], int]] = []

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def field(self, name: str, value: str) -> Multipart:
        return self.file(name, None, [value.encode()], len(value.encode()))

    def file(
        self, name: str, filename: str | None, chunks: Iterable[bytes], size: int
    ) -> Multipart:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        head = f"--{self.boundary}\r\ncontent-disposition: {disp}\r\n\r\n".encode()
        self._pieces.append((head, chunks, size))
        return self

    def closing(self) -> bytes:
        return f"--{self.boundary}--\r\n".encode()

    def __len__(self) -> int:
        return sum(len(h) + n + 2 for h, _c, n in self._pieces) + len(self.closing())

    def __iter__(self) -> Iterator[bytes]:
        for head, chunks, _n in self._pieces:
            yield head
            yield from chunks
            yield b"\r\n"
        yield self.closing()


def adapter_body(layers: int, name: str = "big") -> Multipart:
    """A valid upload of a rank-64 adapter on ``layers`` modules (2 MiB each)."""
    head, data = safetensors_header(layers)
    weights = iter([head, *zeros(data)])
    cfg = config()
    return (
        Multipart()
        .field("name", name)
        .file("files", "adapter_config.json", [cfg], len(cfg))
        .file("files", "adapter_model.safetensors", weights, len(head) + data)
    )


class PairsFile:
    """A JSONL file of ``rows`` training rows made on the fly, as a sized iterable of
    chunks (never held whole): every row the same length; each tenth repeats the row
    five before it with another negative (merged into it: ``duplicates``)."""

    content_type = "application/jsonl"
    ROW = (
        '{{"query": "question {q:07d}: what does the building code say of a balcony?", '
        '"positive": "answer {q:07d}: a balcony over {m:02d} square metres needs a permit '
        'from the municipality first.", "negative": "answer {n:07d}: no permit is needed '
        'for a fence under a metre and a half."}}\n'
    )

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.duplicates = sum(1 for i in range(rows) if i % 10 == 9)

    def row(self, i: int) -> bytes:
        q = i - 5 if i % 10 == 9 else i
        return self.ROW.format(q=q, m=q % 97, n=(i * 7919) % 10_000_000).encode()

    def __len__(self) -> int:
        return self.rows * len(self.row(0))

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, self.rows, 4096):
            yield b"".join(self.row(i) for i in range(start, min(self.rows, start + 4096)))


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> None:
    with contextlib.suppress(OSError):  # "5" resets VmHWM to the current RSS (Linux 4.0+)
        Path(f"/proc/{pid}/clear_refs").write_text("5", encoding="utf-8")


def post(
    port: int, body: Multipart | PairsFile, path: str = "/v1/adapters"
) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        headers = {
            "content-type": body.content_type,
            "content-length": str(len(body)),
            "authorization": f"Bearer {KEY}",
        }
        conn.request("POST", path, body=iter(body), headers=headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def peak_while(pid: int, port: int, send: Any) -> tuple[Any, int, float]:
    """(what ``send()`` returned, how much the server's peak RSS grew meanwhile in KiB,
    the slowest /healthz asked every 50 ms meanwhile, in seconds)."""
    reset_peak(pid)
    before = status_kib(pid, "VmRSS")
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(send()))
    thread.start()
    probes: list[float] = []
    health = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while thread.is_alive() and len(probes) < 2400:
        t0 = time.perf_counter()
        health.request("GET", "/healthz")
        assert health.getresponse().read() == b'{"status":"ok"}'
        probes.append(time.perf_counter() - t0)
        thread.join(0.05)
    thread.join(120)
    health.close()
    assert probes, "no /healthz was asked"
    return result[0], status_kib(pid, "VmHWM") - before, max(probes)


async def _serve(root: Path) -> None:
    from fleetserve.catalog import Catalog
    from fleetserve.gateway import Gateway
    from fleetserve.gateway.adapter_routes import AdapterRoutes
    from fleetserve.gateway.auth import Authenticator, KeyEntry, hash_key
    from fleetserve.gateway.finetune import FineTuneRoutes
    from fleetserve.gateway.upload import Uploads
    from fleetserve.gateway.wiring import Hooks, Routes
    from fleetserve.lifecycle import start_http
    from fleetserve.lora.bases import StaticBases
    from fleetserve.lora.jobs.manager import FineTuning, TrainLimits
    from fleetserve.lora.jobs.queue import MemoryJobQueue
    from fleetserve.lora.jobs.store import JobStore
    from fleetserve.lora.registry import AdapterRegistry
    from fleetserve.lora.store import AdapterStore
    from fleetserve.lora.validate import Limits
    from fleetserve.metrics import Metrics
    from fleetserve.settings import Settings
    from fleetserve.storage import FileStore
    from fleetserve.wire import Scope

    store = AdapterStore(FileStore(root / "store"))
    uploads = Uploads(root / "uploads")
    manager = FineTuning(JobStore(store), MemoryJobQueue(), {BIG: "dense"}.get, TrainLimits())
    registry = AdapterRegistry(
        store,
        limits=Limits(max_rank=RANK, max_bytes=512 << 20),
        bases=StaticBases({BIG: ("dense", big_shapes(256))}),
    )
    entries = [KeyEntry(hash_key(KEY), "alice", frozenset({Scope.INFER, Scope.ADAPTERS_WRITE}))]
    app = Gateway(
        Settings.load(overrides={"tune_dir": str(root / "tune"), "access_log": False}),
        Catalog(),
        None,  # type: ignore[arg-type]  # no inference here
        Metrics(),
        hooks=Hooks(ready=lambda: True),
        routes=Routes(
            adapters=AdapterRoutes(registry, uploads=uploads),
            finetune=FineTuneRoutes(manager, max_file_bytes=MAX_FILE_BYTES, uploads=uploads),
        ),
        authenticator=Authenticator.from_entries(entries),
    )
    _http, _task, port = await start_http(app, "127.0.0.1", 0)
    print(port, flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the test closes our stdin


if __name__ == "__main__":
    asyncio.run(_serve(Path(sys.argv[1])))
