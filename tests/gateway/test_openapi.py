"""``GET /openapi.json`` against a real server: a valid OpenAPI 3.1 document, every
route of the router in it and every path in it routed, and real requests and replies
of every family (JSON and msgpack, errors too) valid against its schemas. Plus token
ids as embeddings input, through OpenAI's own client."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import msgspec
import numpy as np
import pytest

from fleetserve.gateway import adapter_routes, keepalive, model_routes
from fleetserve.gateway import app as app_mod
from fleetserve.gateway import finetune as finetune_routes
from fleetserve.gateway import openapi_types as types
from fleetserve.lora.jobs.manager import JOB_FIELDS
from fleetserve.wire.finetune import ALIASES, RANGES, Job, JobEvent

from ..conftest import TINY, ServerThread
from ..tiny_lora import make_lora
from . import openapi_kit as kit
from .openapi_kit import CHAT, COLBERT, NER, RERANK, SPARSE

JSON, MSGPACK = "application/json", "application/msgpack"
PAIRS = b"".join(
    msgspec.json.encode({"query": f"question {i}", "positive": f"answer {i}"}) + b"\n"
    for i in range(40)
)


@pytest.fixture(scope="module")
def shared(request: pytest.FixtureRequest) -> tuple[ServerThread, Path]:
    return kit.shared(request)


@pytest.fixture(scope="module")
def server(shared: tuple[ServerThread, Path]) -> ServerThread:
    return shared[0]


@pytest.fixture(scope="module")
def root(shared: tuple[ServerThread, Path]) -> Path:
    return shared[1]


@pytest.fixture(scope="module")
def doc(server: ServerThread) -> dict[str, Any]:
    r = httpx.get(server.url + "/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == JSON
    return dict(r.json())


def test_the_document_is_valid_openapi_31(doc: dict[str, Any]) -> None:
    spec = pytest.importorskip("openapi_spec_validator")  # dev extra: openapi-spec-validator
    spec.validate(doc)
    assert doc["openapi"] == "3.1.0"
    # generated from the decoding types: the Structs' own docstrings and defaults
    emb = doc["components"]["schemas"]["EmbeddingsRequest"]
    assert emb["required"] == ["input", "model"]
    assert emb["properties"]["encoding_format"]["default"] == "float"
    assert doc["components"]["schemas"]["EncodeRequest"]["additionalProperties"] is False
    error = doc["components"]["schemas"]["ErrorDetail"]
    assert sorted(error["properties"]) == ["code", "field", "message"]


def router_routes(server: ServerThread) -> list[tuple[str, str]]:
    """(method, path template) of every route the gateway's router dispatches."""
    gateway = server.server.gateway  # type: ignore[union-attr]
    routes = [("post", p) for p in app_mod._BODY_MODEL_ROUTES]
    routes += [("post", prefix + "{model}") for prefix, _ in app_mod._PATH_MODEL_ROUTES]
    source = inspect.getsource(app_mod)
    routes += [
        (m.lower(), p) for m, p in re.findall(r'method == "(\w+)" and path == "([^"]+)"', source)
    ]
    routes += [("get", "/dashboard"), ("get", "/dashboard/static/{file}")]
    routes += [("get", "/dashboard/events")]
    for view in gateway.dashboard.views:
        routes.append(("get", view.prefix if not view.prefix.endswith("/") else view.prefix + "*"))
    routes += [("post", adapter_routes.PREFIX), ("get", adapter_routes.PREFIX)]
    routes += [
        ("get", adapter_routes.PREFIX + "/{id}"),
        ("delete", adapter_routes.PREFIX + "/{id}"),
    ]
    routes += [("post", finetune_routes.FILES), ("get", finetune_routes.FILES)]
    routes += [("delete", keepalive.PREFIX + "{model}" + keepalive.SUFFIX)]
    routes += [("post", model_routes.PREFIX), ("delete", model_routes.PREFIX + "/{id}")]
    routes += [("post", finetune_routes.JOBS), ("get", finetune_routes.JOBS)]
    return routes


def test_every_route_of_the_router_is_in_the_document(
    server: ServerThread, doc: dict[str, Any]
) -> None:
    paths = doc["paths"]
    missing = []
    for method, path in router_routes(server):
        if path.endswith("*"):  # a view's prefix: some documented path under it
            found = any(p.startswith(path[:-1]) and method in paths[p] for p in paths)
        else:
            found = method in paths.get(path, {})
        if not found:
            missing.append(f"{method.upper()} {path}")
    assert not missing, f"routes missing from /openapi.json: {missing}"
    assert len(paths) >= 26


def fill(path: str) -> str:
    return (
        path.replace("{model}", TINY.replace("/", "%2F"))
        .replace("{file}", "core.js")
        .replace("{id}", "nope")
        .replace("{rest}", "x")
    )


def test_every_documented_path_is_routed(server: ServerThread, doc: dict[str, Any]) -> None:
    """No path in the document falls through to the router's 'no route' 404, and each
    answers with a documented status."""
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if path == "/dashboard/events":
                continue  # a stream that stays open: its route is checked by its own tests
            r = httpx.request(method, server.url + fill(path), json={}, timeout=30)
            where = f"{method.upper()} {path}: {r.status_code} {r.text[:200]}"
            assert str(r.status_code) in op["responses"], where
            if r.status_code == 404:
                assert not r.json()["error"]["message"].startswith("no route"), where


# -- real requests and replies against the document's schemas -------------------------


def validate(doc: dict[str, Any], schema: dict[str, Any], value: Any, where: str) -> None:
    """``value`` against one of the document's schemas (its $refs resolve in it)."""
    root = {**schema, "components": doc["components"]}
    try:
        jsonschema.Draft202012Validator(root).validate(value)
    except jsonschema.ValidationError as exc:
        raise AssertionError(f"{where}: {exc.message} at {list(exc.absolute_path)}") from None


def call(
    server: ServerThread,
    doc: dict[str, Any],
    method: str,
    template: str,
    path: str | None = None,
    body: Any = None,
    media: str = JSON,
    valid: bool = True,
    **kw: Any,
) -> httpx.Response:
    """Send ``body`` in ``media`` after checking it against the request schema (unless
    it is meant not to be ``valid``), then check the reply against the schema of its
    status and content type."""
    op = doc["paths"][template][method]
    where = f"{method.upper()} {path or template} ({media})"
    headers = dict(kw.pop("headers", {}))
    if body is not None and valid:
        validate(doc, op["requestBody"]["content"][media]["schema"], kit.plain(body), where)
    if body is not None:
        raw = msgspec.msgpack.encode(body) if media == MSGPACK else msgspec.json.encode(body)
        headers.update({"content-type": media, "accept": media})
        kw["content"] = raw
    r = httpx.request(method, server.url + (path or template), headers=headers, timeout=60, **kw)
    status = op["responses"].get(str(r.status_code))
    assert status is not None, f"{where}: undocumented status {r.status_code}: {r.text[:300]}"
    ctype = r.headers.get("content-type", "").split(";")[0]
    content = status.get("content", {})
    assert ctype in content or "*/*" in content, f"{where}: undocumented content type {ctype}"
    if ctype in (JSON, MSGPACK):
        value = msgspec.msgpack.decode(r.content) if ctype == MSGPACK else r.json()
        validate(doc, content[ctype]["schema"], kit.plain(value), f"{where} -> {r.status_code}")
    return r


TEXTS = ["the quick brown fox", "money in the river bank"]
INFERENCE: list[tuple[str, str, dict[str, Any]]] = [
    # (path template, model, body); the model goes in the path or the body
    ("/v1/embeddings", TINY, {"input": TEXTS}),
    ("/v1/embeddings", TINY, {"input": "one", "encoding_format": "base64", "dimensions": 8}),
    ("/v1/embeddings", TINY, {"input": [[2, 5, 7], [3, 4]]}),
    ("/v1/encode/{model}", TINY, {"inputs": TEXTS}),
    ("/v1/encode/{model}", TINY, {"inputs": TEXTS, "output_dtype": "int8"}),
    ("/v1/encode/{model}", TINY, {"inputs": "x", "output_dtype": "binary"}),
    ("/v1/encode/{model}", SPARSE, {"inputs": TEXTS, "return_tokens": True, "top_k": 3}),
    ("/v1/encode/{model}", COLBERT, {"inputs": TEXTS, "is_query": True}),
    ("/v1/encode/{model}", COLBERT, {"inputs": "a", "output_dtype": "int8"}),
    ("/v1/score/{model}", TINY, {"query": "a fox", "items": TEXTS}),
    ("/v1/score/{model}", RERANK, {"query": "a fox", "items": TEXTS}),
    ("/v1/rerank", RERANK, {"query": "a fox", "documents": TEXTS, "return_documents": True}),
    ("/v1/rerank", SPARSE, {"query": "a fox", "documents": [{"text": "a"}], "top_n": 1}),
    ("/v1/extract/{model}", NER, {"inputs": ["John lives in Paris"]}),
    ("/v1/generate/{model}", CHAT, {"prompt": "hello", "max_tokens": 3}),
    ("/v1/chat/completions", CHAT, {"messages": [{"role": "user", "content": "hi"}]}),
    # errors: unknown model, a bad field, a wrong kind of input
    ("/v1/encode/{model}", "nope/none", {"inputs": "x"}),
    ("/v1/encode/{model}", TINY, {"inputs": "x", "is_query": True}),
    ("/v1/embeddings", TINY, {"input": [[999999]]}),
    ("/v1/generate/{model}", TINY, {"prompt": "x"}),
]


@pytest.mark.parametrize("media", [JSON, MSGPACK])
def test_inference_replies_match_the_document(
    server: ServerThread, doc: dict[str, Any], media: str
) -> None:
    statuses = []
    for template, model, body in INFERENCE:
        if "{model}" in template:
            path = template.replace("{model}", model)
        else:
            path, body = template, {**body, "model": model}
        r = call(server, doc, "post", template, path, body, media)
        statuses.append(r.status_code)
    assert statuses.count(200) == len(INFERENCE) - 4, statuses
    assert statuses[-4:] == [404, 400, 400, 400]


def test_service_routes_match_the_document(server: ServerThread, doc: dict[str, Any]) -> None:
    for path in ("/healthz", "/readyz", "/v1/models", "/openapi.json", "/v1/tuning/runs"):
        assert call(server, doc, "get", path).status_code == 200, path
    assert call(server, doc, "get", "/v1/fleet").status_code == 200
    assert call(server, doc, "get", "/metrics").text.startswith("#")
    assert call(server, doc, "get", "/dashboard").status_code == 200
    assert call(server, doc, "get", "/dashboard/static/{file}", "/dashboard/static/core.js")
    r = call(server, doc, "get", "/v1/tuning/runs/{id}", "/v1/tuning/runs/nope")
    assert r.status_code == 404 and r.json()["error"]["field"] == "id"
    released = "/v1/models/{model}/keep-alive"
    r = call(server, doc, "delete", released, fill(released))
    assert r.status_code == 200 and r.json()["id"] == TINY, r.text
    r = call(server, doc, "delete", released, "/v1/models/nope%2Fnone/keep-alive")
    assert r.status_code == 404, r.text


def test_adapter_and_file_routes_match_the_document(
    server: ServerThread, doc: dict[str, Any], root: Path
) -> None:
    lora = make_lora(root / "dense", root / "lora", rank=2, seed=3)
    files = {
        "config": ("adapter_config.json", (lora / "adapter_config.json").read_bytes()),
        "weights": ("adapter_model.safetensors", (lora / "adapter_model.safetensors").read_bytes()),
    }
    up = call(server, doc, "post", "/v1/adapters", files=files, data={"name": "oa", "base": TINY})
    assert up.status_code == 201, up.text
    aid = up.json()["id"]
    assert call(server, doc, "get", "/v1/adapters").json()["data"][0]["id"] == aid
    assert call(server, doc, "get", "/v1/adapters/{id}", f"/v1/adapters/{aid}").status_code == 200
    emb = {"model": f"{TINY}:{aid}", "input": "hi"}
    assert call(server, doc, "post", "/v1/embeddings", body=emb).status_code == 200
    gone = call(server, doc, "delete", "/v1/adapters/{id}", f"/v1/adapters/{aid}")
    assert gone.json()["deleted"] == [aid]
    bad = call(
        server, doc, "post", "/v1/adapters", body={"name": "x", "weights": "!!", "config": "{}"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "weights"

    headers = {"content-type": "application/jsonl"}
    f = call(server, doc, "post", "/v1/files", "/v1/files?filename=p.jsonl", content=PAIRS,
             headers=headers)  # fmt: skip
    assert f.status_code == 200, f.text
    fid = f.json()["id"]
    assert call(server, doc, "get", "/v1/files").json()["data"][0]["id"] == fid
    assert call(server, doc, "get", "/v1/files/{id}", f"/v1/files/{fid}").json()["rows"] == 40
    assert call(server, doc, "get", "/v1/fine_tuning/jobs").json()["data"] == []
    job = {"model": TINY, "training_file": fid, "hyperparameters": {"rank": 0}}
    r = call(server, doc, "post", "/v1/fine_tuning/jobs", body=job)
    assert r.status_code == 400 and r.json()["error"]["field"] == "hyperparameters.rank"
    r = call(
        server, doc, "post", "/v1/fine_tuning/jobs", body={"model": TINY, "nope": 1}, valid=False
    )
    assert r.status_code == 400 and r.json()["error"]["field"] == "nope"
    # a job is never started here (the embedded server would train it): its wire form
    # is checked from the record the routes serve
    record = Job("ftjob-1", "default", TINY, fid, "s", error={"code": "x", "message": "m",
                 "field": None})  # fmt: skip
    schemas = doc["paths"]["/v1/fine_tuning/jobs/{id}"]["get"]["responses"]["200"]["content"]
    validate(doc, schemas[JSON]["schema"], record.to_dict(), "job")
    events = doc["paths"]["/v1/fine_tuning/jobs/{id}/events"]["get"]["responses"]["200"]
    page = {"object": "list", "data": [JobEvent(1, 2.0, "m").to_dict("ftjob-1")], "has_more": False}
    validate(doc, events["content"][JSON]["schema"], page, "events")


def test_hand_decoded_bodies_match_their_structs() -> None:
    """The routes that decode by hand accept exactly the fields their Structs name."""
    fields = set(types.AdapterUpload.__struct_fields__)
    assert fields == set(adapter_routes.BODY_FIELDS)
    assert set(types.AdapterForm.__struct_fields__) - {"files"} == set(adapter_routes.BODY_FIELDS)
    assert set(types.JobCreate.__struct_fields__) == set(JOB_FIELDS)
    hyper = set(types.HyperparametersIn.__struct_fields__)
    assert hyper == set(RANGES) | set(ALIASES) | {"learning_rate_multiplier"}
    assert set(types.FileForm.__struct_fields__) == set(finetune_routes.FORM_FIELDS)
    job_keys = set(Job("j", "t", "m", "f", "s").to_dict())
    assert set(types.JobObject.__struct_fields__) <= job_keys
    assert dataclasses.is_dataclass(Job)


# -- token ids as embeddings input (OpenAI's client) ------------------------------------


def test_token_ids_embed_like_the_text_they_encode(server: ServerThread, root: Path) -> None:
    import openai
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(root / "dense" / "tokenizer.json"))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    texts = ["the quick brown fox", "a cat sat on the mat"]
    ids = [tok.encode(t).ids for t in texts]

    def vectors(value: Any, **kw: Any) -> np.ndarray[Any, Any]:
        reply = client.embeddings.create(model=TINY, input=value, **kw)
        return np.array([d.embedding for d in reply.data], dtype=np.float32)

    by_text = vectors(texts)
    np.testing.assert_allclose(vectors(ids), by_text, atol=1e-6)  # a list of lists
    np.testing.assert_allclose(vectors(ids[0]), by_text[:1], atol=1e-6)  # one list of ids
    np.testing.assert_allclose(
        vectors(ids, encoding_format="float"), by_text, atol=1e-6
    )  # the client asks for base64 unless told
    reply = client.embeddings.create(model=TINY, input=ids)
    assert reply.usage.prompt_tokens == sum(len(x) for x in ids)
    # longer than the model's max_seq_len (16): cut there, as text is
    long = (ids[0] * 5)[:40]
    np.testing.assert_allclose(vectors([long]), vectors([long[:16]]), atol=1e-6)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=TINY, input=[ids[0], [1, vocab]])
    assert err.value.body["field"] == "input[1][1]"  # type: ignore[index]
    assert f"0 to {vocab - 1}" in err.value.body["message"]  # type: ignore[index]
    for bad, field in (([[1, 2], "text"], "input"), ([[]], "input[0]"), ([-1], "input[0]")):
        with pytest.raises(openai.BadRequestError) as err:
            client.embeddings.create(model=TINY, input=bad)  # type: ignore[arg-type]
        assert err.value.body["field"] == field, err.value.body  # type: ignore[index]


def test_a_tiny_temperature_samples_greedily(server: ServerThread, doc: dict[str, Any]) -> None:
    """Found probing the contract: logits over 1e-30 overflow float32, the softmax was
    NaN and the generation step failed for every sequence in the batch."""
    for t in (1e-30, 1e-300, 5e-324):
        body = {"prompt": "hello", "max_tokens": 2, "temperature": t}
        r = call(server, doc, "post", "/v1/generate/{model}", f"/v1/generate/{CHAT}", body)
        assert r.status_code == 200, r.text
    greedy = {"prompt": "hello", "max_tokens": 2, "temperature": 0}
    r = call(server, doc, "post", "/v1/generate/{model}", f"/v1/generate/{CHAT}", greedy)
    assert r.json()["text"] == call(server, doc, "post", "/v1/generate/{model}",
                                    f"/v1/generate/{CHAT}", {**greedy, "temperature": 1e-30}
                                    ).json()["text"]  # fmt: skip
    bad = call(server, doc, "post", "/v1/generate/{model}", f"/v1/generate/{CHAT}",
               {"prompt": "x", "temperature": 2.5}, valid=False)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "temperature"
