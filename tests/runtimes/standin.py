"""A stand-in for an SGLang or vLLM server: a real HTTP server on 127.0.0.1 port 0.

It speaks SGLang's native ``/generate``, ``/health`` and ``/get_model_info``, and the
OpenAI-compatible ``/v1/completions``, ``/v1/embeddings`` and ``/v1/models`` that
both servers serve, with deterministic fake outputs (see ``standin_api``). It records
every request so tests can assert on the exact bodies, and can be told to fail.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .standin_api import (
    Completion,
    Recorded,
    Rejected,
    fake_completion,
    fake_embedding,
    parse_completion,
    parse_embeddings,
    parse_sglang,
    sglang_meta,
    stops_and_schema,
)

MODEL = "stand-in/model"


class StandIn:
    """``with StandIn() as srv: srv.url``. Faults: ``fail``, ``drop``, ``stream_error``,
    ``delay``. ``incremental`` mirrors SGLang's ``--incremental-streaming-output``."""

    def __init__(
        self,
        *,
        model: str = MODEL,
        api_key: str | None = None,
        incremental: bool = False,
        reverse_embeddings: bool = False,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.incremental = incremental
        self.reverse_embeddings = reverse_embeddings
        self.delay = 0.0
        self.requests: list[Recorded] = []
        self._faults: dict[str, list[tuple[str, int, str]]] = {}
        app = Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/get_model_info", self._model_info, methods=["GET"]),
                Route("/generate", self._generate, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            ]
        )
        config = uvicorn.Config(app, log_level="critical", lifespan="off", http="h11", ws="none")
        self._server = uvicorn.Server(config)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.run, args=([self._sock],), daemon=True)

    # -- lifecycle and test controls ----------------------------------------------------
    def __enter__(self) -> StandIn:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the stand-in server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()

    def fail(self, path: str, status: int, message: str = "stand-in failure") -> None:
        """Answer the next request to ``path`` with ``status`` and an error body."""
        self._faults.setdefault(path, []).append(("status", status, message))

    def drop(self, path: str) -> None:
        """Start the next reply on ``path``, then close the connection."""
        self._faults.setdefault(path, []).append(("drop", 0, ""))

    def stream_error(self, path: str, message: str, code: int = 400) -> None:
        """Send an error event inside the next stream on ``path`` (as SGLang and vLLM do)."""
        self._faults.setdefault(path, []).append(("event", code, message))

    def bodies(self, path: str) -> list[Any]:
        return [r.body for r in self.requests if r.path == path]

    # -- plumbing -----------------------------------------------------------------------
    async def _begin(self, request: Request) -> tuple[Any, tuple[str, int, str] | None]:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        self.requests.append(
            Recorded(request.method, request.url.path, dict(request.headers), body)
        )
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            raise Rejected("Unauthorized", 401)
        faults = self._faults.get(request.url.path)
        fault = faults.pop(0) if faults else None
        if fault is not None and fault[0] == "status":
            raise Rejected(fault[2], fault[1])
        return body, fault

    async def _handle(self, request: Request, answer: Any) -> Response:
        try:
            body, fault = await self._begin(request)
            if fault is not None and fault[0] == "drop":
                return StreamingResponse(_dropped(), media_type="application/json")
            return await answer(body, fault)  # type: ignore[no-any-return]
        except Rejected as exc:
            err = {"message": str(exc), "type": "BadRequestError", "code": exc.status}
            return JSONResponse({"error": err}, status_code=exc.status)

    # -- SGLang native ------------------------------------------------------------------
    async def _health(self, request: Request) -> Response:
        return await self._handle(request, _empty)

    async def _model_info(self, request: Request) -> Response:
        async def info(body: Any, fault: Any) -> Response:
            return JSONResponse(
                {
                    "model_path": self.model,
                    "tokenizer_path": self.model,
                    "is_generation": True,
                    "preferred_sampling_params": None,
                    "weight_version": "default",
                    "has_image_understanding": False,
                    "has_audio_understanding": False,
                }
            )

        return await self._handle(request, info)

    async def _generate(self, request: Request) -> Response:
        async def generate(body: Any, fault: Any) -> Response:
            ids, sp, stream = parse_sglang(body)
            stops, schema = stops_and_schema("sglang", sp)
            out = fake_completion(ids, int(sp.get("max_new_tokens", 128)), stops, schema)
            if not stream:
                return JSONResponse({"text": out.text, "meta_info": sglang_meta(out, done=True)})
            return _sse(self._sglang_events(out, fault))

        return await self._handle(request, generate)

    def _sglang_events(self, out: Completion, fault: Any) -> list[Any]:
        events: list[Any] = []
        for k in range(len(out.pieces)):
            text = out.pieces[k] if self.incremental else "".join(out.pieces[: k + 1])
            last = k == len(out.pieces) - 1
            events.append({"text": text, "meta_info": sglang_meta(out, done=last, upto=k + 1)})
        if fault is not None and fault[0] == "event":
            events[1:] = [{"error": {"message": fault[2]}}]
        return events

    # -- OpenAI-compatible --------------------------------------------------------------
    async def _models(self, request: Request) -> Response:
        async def models(body: Any, fault: Any) -> Response:
            card = {"id": self.model, "object": "model", "owned_by": "vllm", "root": self.model}
            return JSONResponse({"object": "list", "data": [card]})

        return await self._handle(request, models)

    async def _completions(self, request: Request) -> Response:
        async def complete(body: Any, fault: Any) -> Response:
            ids, body = parse_completion(body, self.model)
            stops, schema = stops_and_schema("openai", body)
            out = fake_completion(ids, int(body.get("max_tokens", 16)), stops, schema)
            usage = {
                "prompt_tokens": len(ids),
                "completion_tokens": out.tokens,
                "total_tokens": len(ids) + out.tokens,
            }
            head = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": self.model}
            if not body.get("stream"):
                choice = {"index": 0, "text": out.text, "finish_reason": out.finish}
                return JSONResponse({**head, "choices": [choice], "usage": usage})
            events: list[Any] = []
            for k, piece in enumerate(out.pieces):
                reason = out.finish if k == len(out.pieces) - 1 else None
                choice = {"index": 0, "text": piece, "finish_reason": reason}
                events.append({**head, "choices": [choice]})
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append({**head, "choices": [], "usage": usage})
            if fault is not None and fault[0] == "event":
                err = {"message": fault[2], "type": "BadRequestError", "code": fault[1]}
                events[1:] = [{"error": err}]
            return _sse(events)

        return await self._handle(request, complete)

    async def _embeddings(self, request: Request) -> Response:
        async def embed(body: Any, fault: Any) -> Response:
            inputs = parse_embeddings(body, self.model)
            data = [
                {"object": "embedding", "index": i, "embedding": fake_embedding(x)}
                for i, x in enumerate(inputs)
            ]
            if self.reverse_embeddings:
                data.reverse()
            n = sum(len(x) for x in inputs)
            usage = {"prompt_tokens": n, "total_tokens": n}
            return JSONResponse(
                {"object": "list", "model": self.model, "data": data, "usage": usage}
            )

        return await self._handle(request, embed)


def _sse(events: list[Any]) -> StreamingResponse:
    async def gen() -> AsyncIterator[bytes]:
        for e in events:
            yield b"data: " + json.dumps(e).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


async def _dropped() -> AsyncIterator[bytes]:
    yield b'{"text": "partial'
    raise ConnectionAbortedError("stand-in dropped the connection")


async def _empty(body: Any, fault: Any) -> Response:
    return Response(status_code=200)
