"""What the benchmark compares: servers over HTTP and in-process backends."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np

from . import launch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class HttpTarget:
    """A server started as a subprocess and driven through its OpenAI-style route."""

    name: str
    argv: list[str]
    route: str
    model: str
    ready_path: str
    ready_method: str = "GET"
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    cwd: Path | None = None  # the server's working directory (default: this one)
    log: IO[bytes] | None = None  # its output, closed by stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.route}"

    def start(self, log_dir: Path, timeout: float = 300) -> None:
        self.port = free_port()
        argv = [a.replace("{port}", str(self.port)) for a in self.argv]
        log = open(log_dir / f"{self.name}.log", "wb")  # noqa: SIM115 - lives with the process
        self.log = log
        self.proc = launch.popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            cwd=self.cwd,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {log_dir / self.name}.log")
            try:
                r = httpx.request(
                    self.ready_method, f"http://127.0.0.1:{self.port}{self.ready_path}", timeout=2
                )
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} was not ready within {timeout:.0f}s")

    def body(self, texts: list[str]) -> bytes:
        return json.dumps(
            {"model": self.model, "input": texts, "encoding_format": "base64"}
        ).encode()

    def embed(self, texts: list[str]) -> np.ndarray[Any, Any]:
        r = httpx.post(
            self.url,
            content=self.body(texts),
            headers={"content-type": "application/json"},
            timeout=120,
        )
        r.raise_for_status()
        rows = sorted(r.json()["data"], key=lambda d: d["index"])
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in rows])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.log is not None:
            self.log.close()


def fleetserve_target(
    model: str, extra: list[str] | None = None, name: str = "fleetserve"
) -> HttpTarget:
    return HttpTarget(
        name=name,
        argv=[
            sys.executable,
            "-m",
            "fleetserve",
            "serve",
            "--port",
            "{port}",
            "--models",
            model,
            "--log-level",
            "warning",
            *(extra or []),
        ],
        route="/v1/embeddings",
        model=model,
        ready_path="/readyz",
    )


def infinity_target(venv: Path, model_path: Path, dtype: str) -> HttpTarget:
    return HttpTarget(
        name=f"infinity-{dtype}",
        argv=[
            str(venv / "bin" / "infinity_emb"),
            "v2",
            "--model-id",
            str(model_path),
            "--port",
            "{port}",
            "--engine",
            "torch",
            "--device",
            "cpu",
            "--dtype",
            dtype,
            "--no-model-warmup",
        ],
        route="/embeddings",
        model=str(model_path),
        ready_path="/health",
        env={
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1",
        },
    )


class InProcess:
    """sentence-transformers, or fleetserve's own runtime, called directly."""

    def __init__(
        self,
        name: str,
        model_path: Path,
        precision: str = "fp32",
        batch_size: int = 32,
        device: str = "cpu",
    ) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        self.name = name
        self.batch_size = batch_size
        self.model = SentenceTransformer(str(model_path), device=device)
        self._ctx: Any = None
        if precision != "fp32":
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
            kind = "cuda" if device.startswith("cuda") else "cpu"
            self._ctx = lambda: torch.autocast(kind, dtype=dtype)

    def embed(self, texts: list[str]) -> np.ndarray[Any, Any]:
        import contextlib

        with self._ctx() if self._ctx else contextlib.nullcontext():
            out: np.ndarray[Any, Any] = self.model.encode(
                texts, batch_size=self.batch_size, normalize_embeddings=True
            )
        return out


class InProcessRuntime:
    """fleetserve's own tokenizer, runtime and pooling with a profile (the one serving
    would use), called directly: no server. Batches as the worker forms them: sorted
    by length, within the profile's batch size and padded-token budget."""

    def __init__(
        self, name: str, spec: Any, model_path: Path, profile: Any, device: str = "cpu"
    ) -> None:
        from fleetserve.families.dense import DenseFamily
        from fleetserve.runtimes import create_runtime

        self.name = name
        self.profile = profile
        runtime = create_runtime(
            profile.runtime or spec.runtime,
            device=device,
            precision=profile.precision,
            threads=profile.threads,
        )
        self.family = DenseFamily(spec, runtime, model_path)
        self.family.load()
        self.family.warmup()

    def embed(self, texts: list[str]) -> np.ndarray[Any, Any]:
        ids, _ = self.family.tokenizer.encode(texts, truncate=True)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: np.ndarray[Any, Any] | None = None
        k = 0
        while k < len(order):
            batch = [order[k]]
            while k + len(batch) < len(order) and len(batch) < self.profile.max_batch_size:
                nxt = order[k + len(batch)]
                if len(ids[nxt]) * (len(batch) + 1) > self.profile.max_batch_tokens:
                    break
                batch.append(nxt)
            rows = np.asarray(self.family.forward([ids[i] for i in batch]))
            if out is None:
                out = np.empty((len(ids), rows.shape[1]), np.float32)
            out[batch] = rows
            k += len(batch)
        assert out is not None
        unit: np.ndarray[Any, Any] = out / np.linalg.norm(out, axis=1, keepdims=True)
        return unit
