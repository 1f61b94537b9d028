"""What the upload tests share: adapters and multipart bodies made on the fly (a
large safetensors file of zeros is generated chunk by chunk, never held), and a
gateway serving ``/v1/adapters`` in a subprocess of its own, whose memory the tests
read from ``/proc``.

``python -m tests.gateway.upload_kit DIR`` runs that gateway: a file adapter store
under ``DIR``, a fake base (:data:`BIG`) whose Linear layers are 4096x4096, the key
:data:`KEY` (tenant alice); it prints its port and serves until stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

BIG = "big/base"
KEY = "fs-alice-key-for-upload-tests"
WIDTH, RANK = 4096, 64  # each module's lora_A and lora_B: 1 MiB of float32 each
CHUNK = 1 << 20


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


async def _serve(root: Path) -> None:
    from fleetserve.catalog import Catalog
    from fleetserve.gateway import Gateway
    from fleetserve.gateway.adapters import AdapterRoutes
    from fleetserve.gateway.auth import Authenticator, KeyEntry, hash_key
    from fleetserve.gateway.upload import Uploads
    from fleetserve.lifecycle import start_http
    from fleetserve.lora.bases import StaticBases
    from fleetserve.lora.registry import AdapterRegistry
    from fleetserve.lora.store import AdapterStore
    from fleetserve.lora.validate import Limits
    from fleetserve.metrics import Metrics
    from fleetserve.settings import Settings
    from fleetserve.storage import FileStore
    from fleetserve.wire import Scope

    registry = AdapterRegistry(
        AdapterStore(FileStore(root / "store")),
        limits=Limits(max_rank=RANK, max_bytes=512 << 20),
        bases=StaticBases({BIG: ("dense", big_shapes(256))}),
    )
    entries = [KeyEntry(hash_key(KEY), "alice", frozenset({Scope.INFER, Scope.ADAPTERS_WRITE}))]
    app = Gateway(
        Settings.load(overrides={"tune_dir": str(root / "tune"), "access_log": False}),
        Catalog(),
        None,  # type: ignore[arg-type]  # no inference here
        Metrics(),
        ready=lambda: True,
        authenticator=Authenticator.from_entries(entries),
        adapters=AdapterRoutes(registry, uploads=Uploads(root / "uploads")),
    )
    _http, _task, port = await start_http(app, "127.0.0.1", 0)
    print(port, flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the test closes our stdin


if __name__ == "__main__":
    asyncio.run(_serve(Path(sys.argv[1])))
