"""The HTTP API against a real server on loopback port 0, with a tiny random model."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import numpy as np
import pytest

from ..conftest import TINY, ServerThread, tiny_settings

MP = "application/msgpack"


def post_json(srv: ServerThread, path: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=headers, timeout=30)


def test_health_and_ready(tiny_server: ServerThread) -> None:
    assert httpx.get(tiny_server.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(tiny_server.url + "/readyz").status_code == 200


def test_models_lists_the_catalog(tiny_server: ServerThread) -> None:
    data = httpx.get(tiny_server.url + "/v1/models").json()["data"]
    assert [m["id"] for m in data] == [TINY]
    assert data[0]["loaded"] is True and data[0]["dimensions"] == 32


def test_one_model_is_its_list_entry_and_an_unknown_one_a_404_that_names_the_nearest(
    tiny_server: ServerThread,
) -> None:
    """``GET /v1/models/{id}``: OpenAI's retrieve (``client.models.retrieve``); the id
    holds '/' as it is or escaped. Before, a 404 "no route"."""
    from openai import NotFoundError, OpenAI

    (listed,) = httpx.get(tiny_server.url + "/v1/models").json()["data"]
    for path in (TINY, TINY.replace("/", "%2F")):
        r = httpx.get(f"{tiny_server.url}/v1/models/{path}")
        assert r.status_code == 200 and r.json() == listed
    client = OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0)
    assert client.models.retrieve(TINY).id == TINY
    r = httpx.get(f"{tiny_server.url}/v1/models/{TINY}x")
    error = r.json()["error"]
    assert r.status_code == 404 and error["field"] == "model"
    assert f"did you mean {TINY!r}" in error["message"]
    with pytest.raises(NotFoundError):
        client.models.retrieve("nope/model")
    assert httpx.get(tiny_server.url + "/v1/models/").status_code == 404  # no id: no route


def test_encode_json(tiny_server: ServerThread) -> None:
    r = post_json(tiny_server, f"/v1/encode/{TINY}", {"inputs": ["hello world", "the fox"]})
    assert r.status_code == 200, r.text
    emb = np.asarray(r.json()["embeddings"])
    assert emb.shape == (2, 32)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    assert r.json()["usage"]["tokens"] == 4 + 4
    for h in ("x-queue-time-ms", "x-inference-time-ms", "x-total-time-ms"):
        assert float(r.headers[h]) >= 0.0


def test_encode_msgpack_arrays_and_options(tiny_server: ServerThread) -> None:
    body = msgspec.msgpack.encode(
        {"inputs": ["hello world"], "output_dtype": "float16", "dimensions": 8}
    )
    r = httpx.post(
        f"{tiny_server.url}/v1/encode/{TINY}",
        content=body,
        headers={"content-type": MP, "accept": MP},
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == MP
    arr = msgspec.msgpack.decode(r.content)["embeddings"]
    assert arr["dtype"] == "float16" and arr["shape"] == [1, 8]
    v = np.frombuffer(arr["data"], dtype="<f2").reshape(1, 8)
    assert abs(float(np.linalg.norm(v.astype(np.float32))) - 1.0) < 2e-3


def test_matryoshka_truncates_then_renormalizes(tiny_server: ServerThread) -> None:
    full = post_json(
        tiny_server, f"/v1/encode/{TINY}", {"inputs": ["quick fox"], "normalize": False}
    ).json()["embeddings"][0]
    cut = post_json(
        tiny_server, f"/v1/encode/{TINY}", {"inputs": ["quick fox"], "dimensions": 5}
    ).json()["embeddings"][0]
    want = np.asarray(full[:5]) / np.linalg.norm(full[:5])
    np.testing.assert_allclose(cut, want, rtol=1e-4, atol=1e-6)


def test_single_string_and_accept_json_from_msgpack(tiny_server: ServerThread) -> None:
    r = httpx.post(
        f"{tiny_server.url}/v1/encode/{TINY}",
        content=msgspec.msgpack.encode({"inputs": "fox"}),
        headers={"content-type": MP, "accept": "application/json"},
    )
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 1


def test_openai_embeddings_float_and_base64(tiny_server: ServerThread) -> None:
    r = post_json(tiny_server, "/v1/embeddings", {"model": TINY, "input": ["hello", "world fox"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 2
    assert body["usage"] == {"prompt_tokens": 3 + 4, "total_tokens": 3 + 4}
    floats = np.asarray(body["data"][1]["embedding"], dtype=np.float32)
    r2 = post_json(
        tiny_server,
        "/v1/embeddings",
        {"model": TINY, "input": ["hello", "world fox"], "encoding_format": "base64"},
    )
    b64 = np.frombuffer(base64.b64decode(r2.json()["data"][1]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(b64, floats, rtol=1e-6)
    r3 = post_json(tiny_server, "/v1/embeddings", {"model": TINY, "input": "x", "dimensions": 4})
    assert len(r3.json()["data"][0]["embedding"]) == 4


def test_batching_equals_one_by_one(tiny_server: ServerThread) -> None:
    texts = [" ".join(["fox"] * (i % 9 + 1)) for i in range(40)]
    alone = [
        post_json(tiny_server, f"/v1/encode/{TINY}", {"inputs": [t]}).json()["embeddings"][0]
        for t in texts[:6]
    ]
    # one large request is split across several batches (max 8 items, 256 tokens)
    together = post_json(tiny_server, f"/v1/encode/{TINY}", {"inputs": texts}).json()
    np.testing.assert_allclose(np.asarray(together["embeddings"][:6]), alone, atol=1e-5)

    def one(t: str) -> list[float]:
        r = post_json(tiny_server, f"/v1/encode/{TINY}", {"inputs": [t]})
        return list(r.json()["embeddings"][0])

    with ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(one, texts))
    np.testing.assert_allclose(np.asarray(concurrent), together["embeddings"], atol=1e-5)


def test_metrics_exposes_stages_and_batches(tiny_server: ServerThread) -> None:
    post_json(tiny_server, f"/v1/encode/{TINY}", {"inputs": ["metric fox"]})
    text = httpx.get(tiny_server.url + "/metrics").text
    for name in (
        "fleetserve_requests_total",
        "fleetserve_stage_latency_seconds_bucket",
        "fleetserve_batch_size_bucket",
        "fleetserve_batch_tokens_bucket",
        "fleetserve_queue_depth",
        "fleetserve_tokens_total",
    ):
        assert name in text
    assert 'stage="inference"' in text and 'stage="queue"' in text and 'stage="total"' in text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": []}, "inputs"),
        ({"inputs": [""]}, "inputs[0]"),
        ({"inputs": [1, 2]}, "inputs[0]"),
        ({"inputs": "x", "normalize": "yes"}, "normalize"),
        ({"inputs": "x", "output_dtype": "int3"}, "output_dtype"),
        ({"inputs": "x", "dimensions": 0}, "dimensions"),
        ({"inputs": "x", "dimensions": 33}, "dimensions"),
        ({"texts": ["x"]}, "body"),
        ({"inputs": "x", "surprise": 1}, "body"),
        ([1, 2, 3], "body"),
    ],
)
def test_bad_input_is_400_naming_the_field(
    tiny_server: ServerThread, body: object, field: str
) -> None:
    r = post_json(tiny_server, f"/v1/encode/{TINY}", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_input"
    assert err["field"] == field or (field == "body" and err["field"])


@pytest.mark.parametrize("raw", [b"{not json", b"\x00\x01", b""])
def test_malformed_json_is_400(tiny_server: ServerThread, raw: bytes) -> None:
    r = httpx.post(
        f"{tiny_server.url}/v1/encode/{TINY}",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["field"] == "body"


def test_malformed_msgpack_is_400(tiny_server: ServerThread) -> None:
    r = httpx.post(
        f"{tiny_server.url}/v1/encode/{TINY}",
        content=b"\xc1\xc1",
        headers={"content-type": MP, "accept": MP},
    )
    assert r.status_code == 400
    assert msgspec.msgpack.decode(r.content)["error"]["code"] == "invalid_input"


def test_unknown_model_is_404(tiny_server: ServerThread) -> None:
    r = post_json(tiny_server, "/v1/encode/no/such-model", {"inputs": ["x"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = post_json(tiny_server, "/v1/embeddings", {"model": "nope", "input": "x"})
    assert r.status_code == 404


def test_openai_route_without_model_is_400(tiny_server: ServerThread) -> None:
    r = post_json(tiny_server, "/v1/embeddings", {"input": "x"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "model"


def test_unsupported_content_type_is_415(tiny_server: ServerThread) -> None:
    r = httpx.post(
        f"{tiny_server.url}/v1/encode/{TINY}", content=b"x", headers={"content-type": "text/plain"}
    )
    assert r.status_code == 415


def test_unknown_route_is_404(tiny_server: ServerThread) -> None:
    assert httpx.get(tiny_server.url + "/nope").status_code == 404


def test_overlong_text_truncates_or_400(tiny_server: ServerThread) -> None:
    long = " ".join(["fox"] * 100)  # the tiny spec allows 16 tokens
    ok = post_json(tiny_server, f"/v1/encode/{TINY}", {"inputs": [long]})
    assert ok.status_code == 200 and ok.json()["usage"]["tokens"] == 16
    bad = post_json(tiny_server, f"/v1/encode/{TINY}", {"inputs": ["fox", long], "truncate": False})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "inputs[1]"


def test_bad_timeout_header_is_400(tiny_server: ServerThread) -> None:
    for v in ("soon", "-1", "0", "nan"):
        r = post_json(
            tiny_server, f"/v1/encode/{TINY}", {"inputs": ["x"]}, **{"x-request-timeout": v}
        )
        assert r.status_code == 400 and r.json()["error"]["field"] == "x-request-timeout"


def test_huge_body_is_413_and_server_stays_healthy(tiny_server: ServerThread) -> None:
    limit = tiny_server.settings.max_body_bytes
    r = httpx.post(
        f"{tiny_server.url}/v1/encode/{TINY}",
        content=b"x" * (limit + 1),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

    def chunks() -> object:
        for _ in range(limit // 65536 + 2):
            yield b"y" * 65536

    r = httpx.post(
        f"{tiny_server.url}/v1/encode/{TINY}",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    assert httpx.get(tiny_server.url + "/readyz").status_code == 200


def test_bad_requests_do_not_harm_others_in_flight(tiny_server: ServerThread) -> None:
    good = {"inputs": ["hello world"]}
    want = post_json(tiny_server, f"/v1/encode/{TINY}", good).json()["embeddings"]
    bads: list[object] = [{"inputs": []}, {"inputs": [3]}, "garbage", {"inputs": ["x"] * 3}]

    def send(i: int) -> tuple[int, object]:
        if i % 2:
            r = post_json(tiny_server, f"/v1/encode/{TINY}", bads[i % len(bads)])
            return r.status_code, None
        r = post_json(tiny_server, f"/v1/encode/{TINY}", good)
        return r.status_code, r.json()["embeddings"]

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(send, range(60)))
    for i, (status, emb) in enumerate(results):
        if i % 2 == 0:
            assert status == 200
            np.testing.assert_allclose(np.asarray(emb), want, atol=1e-6)
        else:
            assert status in (200, 400)
    assert httpx.get(tiny_server.url + "/readyz").status_code == 200


def test_normalize_defaults_to_the_model_spec(tiny_catalog: Path) -> None:
    import yaml

    spec_file = next(tiny_catalog.glob("*.yaml"))
    spec = yaml.safe_load(spec_file.read_text())
    other = tiny_catalog.parent / "catalog-raw"
    other.mkdir(exist_ok=True)
    spec["normalize"] = False
    (other / spec_file.name).write_text(yaml.safe_dump(spec))
    srv = ServerThread(tiny_settings(other)).start()
    try:
        raw = post_json(srv, f"/v1/encode/{TINY}", {"inputs": ["quick fox"]}).json()
        unit = post_json(
            srv, f"/v1/encode/{TINY}", {"inputs": ["quick fox"], "normalize": True}
        ).json()
        assert abs(np.linalg.norm(raw["embeddings"][0]) - 1.0) > 1e-3
        assert abs(np.linalg.norm(unit["embeddings"][0]) - 1.0) < 1e-5
    finally:
        srv.stop()
