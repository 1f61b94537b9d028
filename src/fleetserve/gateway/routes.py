"""Which routes are inference routes (and where their model id is), and the SSE error
event: the gateway's pure helpers, kept apart from its request handling."""

from __future__ import annotations

import json
from urllib.parse import unquote

from ..wire import Task

# the model id in the body (OpenAI's routes)
BODY_MODEL_ROUTES = {
    "/v1/embeddings": Task.EMBEDDINGS,
    "/v1/rerank": Task.RERANK,
    "/v1/chat/completions": Task.CHAT,
}
# the model id in the path, after the prefix (fleetserve's native routes)
PATH_MODEL_ROUTES = (
    ("/v1/encode/", Task.ENCODE),
    ("/v1/score/", Task.SCORE),
    ("/v1/extract/", Task.EXTRACT),
    ("/v1/generate/", Task.GENERATE),
)


def inference_route(method: str, path: str) -> tuple[Task, str | None] | None:
    """The task and model id (``None``: in the body) of an inference route."""
    if method != "POST":
        return None
    if path in BODY_MODEL_ROUTES:
        return BODY_MODEL_ROUTES[path], None
    for prefix, task in PATH_MODEL_ROUTES:
        if path.startswith(prefix):
            return task, unquote(path[len(prefix) :])
    return None


def is_adapters(path: str) -> bool:
    return path == "/v1/adapters" or path.startswith("/v1/adapters/")


def sse_error(error: dict[str, object]) -> bytes:
    """An error after the stream started: one SSE ``error`` event (OpenAI's shape)."""
    return b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n"


__all__ = [
    "BODY_MODEL_ROUTES",
    "PATH_MODEL_ROUTES",
    "inference_route",
    "is_adapters",
    "sse_error",
]
