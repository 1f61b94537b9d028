"""Drop-in routes for people who run text-embeddings-inference (TEI) or infinity-emb
today: their clients switch by changing a URL.

- TEI: ``POST /embed``, ``/embed_sparse``, ``/rerank`` (a body with ``texts``),
  ``/predict``, ``GET /info``, and ``POST /`` (what ``huggingface_hub.InferenceClient``
  posts to a server's URL: ``/embed``).
- infinity: ``POST /embeddings``, ``/rerank`` (a body with ``documents``), ``GET
  /models``.

Each route's body becomes the native request of the same task and goes the native way
(queue, worker, family); its reply is rewritten in the route's own shape, errors too
(TEI's ``{"error", "error_type"}`` with its statuses). This is the one place where the
gateway reads a reply: these routes trade that for their clients' shapes, in JSON.
TEI serves one model: here a body may name one (``model``); without it, the first
model of the catalog that serves the route's task (pinned ones first). The differences
from the originals are in ``docs/compat.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..catalog import Catalog, ModelSpec
from ..wire import FleetError, InvalidInput, Task

Json = Any  # a decoded JSON value: the routes check the shapes they read


@dataclass(frozen=True, slots=True)
class Native:
    """A compat request as the native route takes it."""

    task: Task
    model: str
    path: str  # the native route, for the access line
    body: dict[str, object]


@dataclass(frozen=True, slots=True)
class Route:
    """One drop-in route: its task's families, how its body becomes the native one,
    how the native reply becomes its own, and whose error shape it answers with."""

    families: tuple[str, ...]
    request: Callable[[dict[str, Json], str], Native]
    reply: Callable[[Json, dict[str, Json]], Json]
    tei: bool  # TEI's error shape and statuses; else the native (OpenAI-like) one


def _texts(body: dict[str, Json], field: str = "inputs") -> list[str]:
    value = body.get(field)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(t, str) for t in items):
        raise InvalidInput(
            f"`{field}` must be a string or a non-empty list of strings", field=field
        )
    return items


def _flag(body: dict[str, Json], field: str, default: bool) -> bool:
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"`{field}` must be true or false", field=field)
    return value


def _tei_truncation(body: dict[str, Json]) -> bool:
    """TEI's ``truncate`` (default false: an over-long input is a 422, never cut
    silently); only right truncation exists here."""
    if str(body.get("truncation_direction", "Right")).lower() != "right":
        raise InvalidInput(
            "only truncation_direction Right is served", field="truncation_direction"
        )
    if body.get("prompt_name") is not None:
        raise InvalidInput(
            "prompt_name is not served: put the prompt in the text", field="prompt_name"
        )
    return _flag(body, "truncate", False)


# -- TEI --------------------------------------------------------------------------------
def _embed(body: dict[str, Json], model: str) -> Native:
    native: dict[str, object] = {
        "inputs": _texts(body),
        "normalize": _flag(body, "normalize", True),
        "truncate": _tei_truncation(body),
    }
    if body.get("dimensions") is not None:
        native["dimensions"] = body["dimensions"]
    return Native(Task.ENCODE, model, f"/v1/encode/{model}", native)


def _embed_reply(reply: Json, body: dict[str, Json]) -> Json:
    return reply["embeddings"]


def _sparse(body: dict[str, Json], model: str) -> Native:
    native = {"inputs": _texts(body), "truncate": _tei_truncation(body)}
    return Native(Task.ENCODE, model, f"/v1/encode/{model}", native)


def _sparse_reply(reply: Json, body: dict[str, Json]) -> Json:
    return [
        [{"index": i, "value": v} for i, v in zip(e["indices"], e["values"], strict=True)]
        for e in reply["embeddings"]
    ]


def _rerank(body: dict[str, Json], model: str) -> Native:
    query = body.get("query")
    if not isinstance(query, str):
        raise InvalidInput("`query` must be a string", field="query")
    native = {"model": model, "query": query, "documents": _texts(body, "texts"),
              "return_documents": _flag(body, "return_text", False)}  # fmt: skip
    _tei_truncation(body)  # checked; the reranker cuts pairs to its length as TEI's does
    return Native(Task.RERANK, model, "/v1/rerank", native)


def _rerank_reply(reply: Json, body: dict[str, Json]) -> Json:
    out = []
    for r in reply["results"]:
        row: dict[str, object] = {"index": r["index"], "score": r["relevance_score"]}
        if "document" in r:
            row["text"] = r["document"]["text"]
        out.append(row)
    return out


def _predict(body: dict[str, Json], model: str) -> Native:
    """TEI's classifier route, for a pair (``[query, text]``) on a cross-encoder: its
    score, as TEI answers a one-label reranker."""
    pair = body.get("inputs")
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
        raise InvalidInput(
            "`inputs` must be a pair [text, text]: fleetserve serves /predict with its "
            "cross-encoders (for labels, /v1/extract/{model})",
            field="inputs",
        )
    native = {"model": model, "query": pair[0], "documents": [pair[1]]}
    return Native(Task.RERANK, model, "/v1/rerank", native)


def _predict_reply(reply: Json, body: dict[str, Json]) -> Json:
    return [{"score": reply["results"][0]["relevance_score"], "label": "LABEL_0"}]


# -- infinity ---------------------------------------------------------------------------
def _embeddings(body: dict[str, Json], model: str) -> Native:
    return Native(Task.EMBEDDINGS, model, "/v1/embeddings", {**body, "model": model})


def _same(reply: Json, body: dict[str, Json]) -> Json:
    return reply


def _documents(body: dict[str, Json], model: str) -> Native:
    keys = ("query", "documents", "top_n", "return_documents")
    native: dict[str, object] = {k: body[k] for k in keys if k in body}
    return Native(Task.RERANK, model, "/v1/rerank", {**native, "model": model})


def _documents_reply(reply: Json, body: dict[str, Json]) -> Json:
    results = [
        {**r, "document": r["document"]["text"]} if "document" in r else r for r in reply["results"]
    ]
    return {**reply, "object": "rerank", "results": results}


EMBEDDERS = ("dense", "multivector")
RERANKERS = ("cross_encoder", "dense")
TEI = {
    "/embed": Route(EMBEDDERS, _embed, _embed_reply, tei=True),
    "/": Route(EMBEDDERS, _embed, _embed_reply, tei=True),
    "/embed_sparse": Route(("sparse",), _sparse, _sparse_reply, tei=True),
    "/rerank": Route(RERANKERS, _rerank, _rerank_reply, tei=True),
    "/predict": Route(("cross_encoder",), _predict, _predict_reply, tei=True),
}
INFINITY = {
    "/embeddings": Route(EMBEDDERS, _embeddings, _same, tei=False),
    "/rerank": Route(RERANKERS, _documents, _documents_reply, tei=False),
}
PATHS = frozenset({*TEI, *INFINITY})


def route_for(path: str, body: dict[str, Json]) -> Route:
    """TEI's or infinity's route at ``path``; ``POST /rerank`` is either (TEI's body
    has ``texts``, infinity's ``documents``)."""
    if path == "/rerank":
        return TEI[path] if "texts" in body else INFINITY[path]
    return TEI[path] if path in TEI else INFINITY[path]


def model_for(
    route: Route, body: dict[str, Json], catalog: Catalog, served: Sequence[str] = ()
) -> str:
    """The body's ``model``; else the catalog's first model of the route's families (in
    their order), those named in ``--models`` first (``served``), then pinned ones."""
    named = body.get("model")
    if isinstance(named, str) and named:
        return catalog.get(named).id  # a 404 with a did-you-mean when unknown
    order = {m: i for i, m in enumerate(served)}
    fits = [s for s in catalog if s.family in route.families]
    if not fits:
        families = ", ".join(route.families)
        raise InvalidInput(f"no model here serves this route ({families})", field="model")
    best = min(
        fits,
        key=lambda s: (route.families.index(s.family), order.get(s.id, len(order)), not s.pinned),
    )
    return best.id


def decode(raw: bytes) -> dict[str, Json]:
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"the body is not JSON: {exc}", field="body") from None
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object", field="body")
    return body


TEI_ERRORS = {"invalid_input": (422, "Validation"), "payload_too_large": (413, "Validation"),
              "overloaded": (429, "Overloaded"), "unavailable": (503, "Unhealthy")}  # fmt: skip


def tei_error(status: int, native: Json) -> tuple[int, Json]:
    """A native error reply in TEI's shape: ``{"error", "error_type"}``, TEI's status."""
    err = native.get("error", {}) if isinstance(native, dict) else {}
    code, message = str(err.get("code", "")), str(err.get("message", "error"))
    status, kind = TEI_ERRORS.get(code, (status if status < 500 else 424, "Backend"))
    return status, {"error": message, "error_type": kind}


def error_body(route_tei: bool, err: FleetError, status: int) -> tuple[int, Json]:
    """An error raised before the native route ran, in the route's shape."""
    return tei_error(status, err.to_body()) if route_tei else (status, err.to_body())


def info(catalog: Catalog, spec: ModelSpec | None, version: str, max_batch: int) -> Json:
    """TEI's ``GET /info`` for the model its ``/embed`` serves."""
    if spec is None:
        return {"model_id": None, "version": version, "router": "fleetserve"}
    kind = {"cross_encoder": {"reranker": {"id2label": {"0": "LABEL_0"}}}}.get(
        spec.family, {"embedding": {"pooling": spec.pooling or "mean"}}
    )
    return {
        "model_id": spec.id, "model_sha": None, "model_dtype": "float32",
        "model_type": kind, "max_input_length": spec.max_seq_len,
        "max_client_batch_size": max_batch, "version": version, "router": "fleetserve",
    }  # fmt: skip
