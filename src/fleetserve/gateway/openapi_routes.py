"""The route table behind ``GET /openapi.json``: path, method, and the types of each
request and reply. It names types only; their schemas are generated from them
(``gateway.openapi``). The request types are the ones the server decodes with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..wire import requests as rq
from ..wire.image_requests import ImageEncodeRequest, ImageScoreRequest
from . import openapi_types as t

JSON, MSGPACK = "application/json", "application/msgpack"
BOTH = (JSON, MSGPACK)
MULTIPART = "multipart/form-data"
TEXT = "text/plain"
HTML = "text/html"
SSE = "text/event-stream"
JSONL = "application/jsonl"

# a body per media type; a tuple of types is any one of them
Bodies = dict[str, Any]
INFER_ERRORS = (400, 401, 403, 404, 413, 415, 429, 500, 503, 504)
ADMIN_ERRORS = (400, 401, 403, 404, 409, 413, 415, 500, 503)
UPLOAD_ERRORS = (*ADMIN_ERRORS[:-2], 429, *ADMIN_ERRORS[-2:])  # max_uploads_per_tenant
READ_ERRORS = (400, 401, 403, 404, 500)


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # path, query or header
    schema: dict[str, Any]
    description: str
    required: bool = False


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    op_id: str
    summary: str
    tag: str
    reply: Bodies  # the success body per media type (None: no schema, e.g. HTML)
    status: int = 200
    request: Bodies | None = None
    errors: tuple[int, ...] = ()
    params: tuple[Param, ...] = ()
    extra: dict[int, Bodies] = field(default_factory=dict)  # other non-error statuses


def _same(typ: object, media: tuple[str, ...] = BOTH) -> Bodies:
    return {m: typ for m in media}


MODEL = Param(
    "model",
    "path",
    {"type": "string", "minLength": 1},
    "A catalog model id (it may contain '/', sent as %2F or as more path segments); "
    "'base:tenant/name' calls an adapter of the base model.",
    required=True,
)
INFER_HEADERS = (
    Param("x-request-id", "header", {"type": "string"}, "Echoed back; a new id if absent."),
    Param(
        "x-request-timeout",
        "header",
        {"type": "number", "exclusiveMinimum": 0},
        "The deadline in seconds (default: the server's request or generation timeout).",
    ),
    Param(
        "x-priority",
        "header",
        {"type": "string", "enum": ["interactive", "batch"]},
        "The class to serve it in; large requests claiming interactive run as batch.",
    ),
    Param(
        "x-keep-alive",
        "header",
        {"type": "string", "pattern": "^[0-9]{1,6}(ms|s|m|h)?$"},
        "How long the model stays resident after this request: 30s, 5m, seconds; cut to the "
        "server's cap (the reply's X-Keep-Alive-Applied and X-Keep-Alive-Max say what held).",
    ),
)
ID = Param("id", "path", {"type": "string", "minLength": 1}, "The object's id.", required=True)
LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100}, "Page size.")
AFTER = Param("after", "query", {"type": "string"}, "The last id of the previous page.")

ENCODE_JSON = (rq.EncodeRequest, rq.SparseEncodeRequest, rq.MultiVectorEncodeRequest)
ENCODE_REPLY = (t.EncodeReply, t.SparseEncodeReply, t.MultiVectorEncodeReply)
GEN_REPLY = {**_same(t.GenerateReply), SSE: t.SseEvent}  # the schema of each event
CHAT_REPLY = {**_same(t.ChatCompletionReply), SSE: t.SseEvent}


def _infer(path: str, op_id: str, summary: str, request: Bodies, reply: Bodies) -> Op:
    native = "{model}" in path
    params = ((MODEL,) if native else ()) + INFER_HEADERS
    return Op("post", path, op_id, summary, "inference", reply, 200, request, INFER_ERRORS, params)


INFERENCE: tuple[Op, ...] = (
    _infer(
        "/v1/embeddings",
        "embeddings",
        "OpenAI embeddings; input is text, a list of texts, token ids or lists of token ids",
        _same(rq.EmbeddingsRequest),
        _same(t.EmbeddingsReply),
    ),
    _infer(
        "/v1/chat/completions",
        "chat_completions",
        "OpenAI chat completions (stream: server-sent events)",
        _same(rq.ChatCompletionRequest),
        CHAT_REPLY,
    ),
    _infer(
        "/v1/rerank",
        "rerank",
        "Cohere/Jina rerank",
        _same(rq.RerankRequest),
        _same(t.RerankReply),
    ),
    _infer(
        "/v1/encode/{model}",
        "encode",
        "Vectors: dense, sparse, multi-vector or image (the body's shape is the family's)",
        {JSON: (*ENCODE_JSON, ImageEncodeRequest[str]),
         MSGPACK: (*ENCODE_JSON, ImageEncodeRequest[bytes])},
        _same(ENCODE_REPLY),
    ),
    _infer(
        "/v1/score/{model}",
        "score",
        "Score items against a query (texts; images for image models)",
        {JSON: (rq.ScoreRequest, ImageScoreRequest[str]),
         MSGPACK: (rq.ScoreRequest, ImageScoreRequest[bytes])},
        _same(t.ScoreReply),
    ),
    _infer(
        "/v1/extract/{model}",
        "extract",
        "Entities (NER, span NER) or labels (zero-shot)",
        _same(rq.ExtractRequest),
        _same(t.ExtractReply),
    ),
    _infer(
        "/v1/generate/{model}",
        "generate",
        "Text from a raw prompt (stream: server-sent events)",
        _same(rq.GenerateRequest),
        GEN_REPLY,
    ),
)  # fmt: skip

# a model's id in a path: retrieve, and hot remove (gateway/model_routes.py)
MODEL_ID = Param(
    "id",
    "path",
    {"type": "string", "minLength": 1},
    "A served model's id (it may contain '/').",
    required=True,
)

SERVICE: tuple[Op, ...] = (
    Op("get", "/healthz", "healthz", "Alive", "service", _same(t.Health, (JSON,)),
       extra={503: _same(t.Health, (JSON,))}),
    Op("get", "/readyz", "readyz", "Can serve", "service", _same(t.Ready, (JSON,)),
       extra={503: _same(t.Ready, (JSON,))}),
    Op("get", "/openapi.json", "openapi", "This document", "service", {JSON: dict[str, Any]},
       errors=(401,)),
    Op("get", "/metrics", "metrics", "Prometheus metrics (with keys: the metrics scope)",
       "service", {TEXT: str}, errors=(401, 403)),
    Op("get", "/v1/models", "models", "The catalog's models", "service",
       _same(t.ModelList, (JSON,)), errors=(401, 403)),
    Op("get", "/v1/models/{id}", "model", "One of the catalog's models, as the list has it "
       "(OpenAI's retrieve)", "service", _same(t.ModelCard, (JSON,)), errors=(401, 403, 404),
       params=(MODEL_ID,)),
    Op("delete", "/v1/models/{model}/keep-alive", "model_keep_alive_release",
       "End a model's keep-alive now (admin): it may leave when memory is wanted", "service",
       _same(t.KeepAliveReleased, (JSON,)), errors=(400, 401, 403, 404, 500, 503),
       params=(Param("model", "path", {"type": "string", "minLength": 1},
                     "A catalog model id (it may contain '/').", required=True),)),
)  # fmt: skip

MODELS: tuple[Op, ...] = (
    Op("post", "/v1/models", "model_add",
       "Serve a model without a restart (admin): a catalog spec's fields (id, sources, "
       "family...), or a source alone to infer them; sources are held to --model-roots",
       "service", _same(t.ModelCard), 201, _same(dict[str, Any]), ADMIN_ERRORS),
    Op("delete", "/v1/models/{id}", "model_remove",
       "Remove a model (admin): its queued requests get 404, those under way finish, "
       "then it is unloaded", "service", _same(t.ModelDeleted), errors=ADMIN_ERRORS,
       params=(MODEL_ID,)),
)  # fmt: skip

DASHBOARD: tuple[Op, ...] = (
    Op("get", "/dashboard", "dashboard", "The web page", "dashboard", {HTML: str},
       extra={304: {}}),
    Op("get", "/dashboard/static/{file}", "dashboard_static", "The page's scripts and styles",
       "dashboard", {"*/*": str}, errors=(404,), extra={304: {}},
       params=(Param("file", "path", {"type": "string", "minLength": 1}, "A file name.", True),)),
    Op("get", "/dashboard/events", "dashboard_events",
       "Server-sent events naming the views whose data changed", "dashboard", {SSE: t.SseEvent},
       errors=(401, 403)),
)  # fmt: skip

# the JSON of the dashboard views this module knows, by the view's route prefix
VIEWS: dict[str, tuple[Op, ...]] = {
    "/v1/tuning/": (
        Op("get", "/v1/tuning/runs", "tuning_runs", "Tuning runs, newest first", "dashboard",
           _same(t.ViewList), errors=READ_ERRORS),
        Op("get", "/v1/tuning/runs/{id}", "tuning_run", "One tuning run's document",
           "dashboard", _same(dict[str, Any]), errors=READ_ERRORS, params=(ID,)),
    ),
    "/v1/added/": (
        Op("get", "/v1/added/models", "added_models",
           "The models `fleetserve add` added, newest first", "dashboard",
           _same(t.ViewList), errors=READ_ERRORS),
        Op("get", "/v1/added/models/{id}", "added_model", "One `fleetserve add` report",
           "dashboard", _same(dict[str, Any]), errors=READ_ERRORS, params=(ID,)),
    ),
}  # fmt: skip

ADAPTERS: tuple[Op, ...] = (
    Op("post", "/v1/adapters", "adapter_upload", "Upload a LoRA adapter", "adapters",
       _same(t.AdapterInfo), 201,
       {MULTIPART: t.AdapterForm, JSON: t.AdapterUpload, MSGPACK: t.AdapterUpload},
       UPLOAD_ERRORS),
    Op("get", "/v1/adapters", "adapter_list", "The adapters the caller sees", "adapters",
       _same(t.AdapterList), errors=READ_ERRORS,
       params=(Param("base", "query", {"type": "string"}, "Only adapters of this model."),)),
    Op("get", "/v1/adapters/{id}", "adapter_get",
       "One adapter: tenant/name (newest), tenant/name@N, or a name of the caller's tenant",
       "adapters", _same(t.AdapterInfo), errors=READ_ERRORS, params=(ID,)),
    Op("delete", "/v1/adapters/{id}", "adapter_delete",
       "Delete an adapter (tenant/name: every version)", "adapters",
       _same(t.AdapterDeleted), errors=ADMIN_ERRORS, params=(ID,)),
)  # fmt: skip

FINETUNE: tuple[Op, ...] = (
    Op("post", "/v1/files", "file_upload", "Upload a JSONL file of training pairs", "fine-tuning",
       _same(t.FileObject), 200, {MULTIPART: t.FileForm, JSONL: str}, UPLOAD_ERRORS,
       (Param("filename", "query", {"type": "string"}, "The file's name (raw uploads)."),
        Param("purpose", "query", {"type": "string"}, "fine-tune (raw uploads)."),
        Param("truncate", "query", {"type": "boolean"},
              "Cut texts over train_max_chars to it instead of a 400 (also a form field).")),
       ),
    Op("get", "/v1/files", "file_list", "The caller's files", "fine-tuning",
       _same(t.FileList), errors=READ_ERRORS),
    Op("get", "/v1/files/{id}", "file_get", "One file", "fine-tuning", _same(t.FileObject),
       errors=READ_ERRORS, params=(ID,)),
    Op("post", "/v1/fine_tuning/jobs", "job_create", "Queue a fine-tuning job", "fine-tuning",
       _same(t.JobObject), 200, _same(t.JobCreate), ADMIN_ERRORS),
    Op("get", "/v1/fine_tuning/jobs", "job_list", "Jobs, newest first", "fine-tuning",
       _same(t.JobList), errors=READ_ERRORS, params=(LIMIT, AFTER)),
    Op("get", "/v1/fine_tuning/jobs/{id}", "job_get", "One job", "fine-tuning",
       _same(t.JobObject), errors=READ_ERRORS, params=(ID,)),
    Op("get", "/v1/fine_tuning/jobs/{id}/events", "job_events", "A job's events, newest first",
       "fine-tuning", _same(t.JobEventList), errors=READ_ERRORS, params=(ID, LIMIT, AFTER)),
    Op("post", "/v1/fine_tuning/jobs/{id}/cancel", "job_cancel", "Cancel a job", "fine-tuning",
       _same(t.JobObject), errors=ADMIN_ERRORS, params=(ID,)),
)  # fmt: skip


def view_ops(prefix: str, name: str) -> tuple[Op, ...]:
    """A dashboard view's JSON: the table's entry, or for a view this module does not
    know, one free-form route: the prefix itself (``/v1/fleet``), or under it
    (``/v1/x/{rest}``) when it ends with a slash."""
    if prefix in VIEWS:
        return VIEWS[prefix]
    params: tuple[Param, ...] = ()
    path = prefix
    if prefix.endswith("/"):
        path = prefix + "{rest}"
        params = (Param("rest", "path", {"type": "string"}, "The view's sub-path.", True),)
    return (
        Op("get", path, f"view_{name}", f"The {name} view's data", "dashboard",
           _same(dict[str, Any]), errors=READ_ERRORS, params=params),
    )  # fmt: skip
