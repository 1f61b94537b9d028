"""Zero-shot classification: NLI against transformers' pipeline, embeddings on MiniLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.assembly import HF_CACHE
from fleetserve.catalog import Catalog
from fleetserve.catalog.sources import resolve
from fleetserve.families.zero_shot_nli import nli_classes
from fleetserve.wire import Encoding, InvalidInput

from ..tiny_extract import (
    build_nli_classifier,
    call,
    call_together,
    make_family,
    onnx_runtime,
    openvino_runtime,
)
from ..tinymodels import build_bert

TEXTS = ["the quick brown fox", "money in the bank", "a cat sat on the mat", "hello world"]
LABELS = ["money", "water", "dog", "fleet"]
EMBED_REAL = "zero-shot/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def nli_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nli_classifier(tmp_path_factory.mktemp("nli"))


@pytest.fixture(scope="module")
def nli(nli_model: Path) -> Any:
    return make_family("zero_shot", nli_model)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = build_bert(tmp_path_factory.mktemp("embed"))
    return make_family("zero_shot", model, options={"method": "embedding"})


def pipeline_results(model: Path, texts: list[str], labels: list[str], **kw: Any) -> list[Any]:
    from transformers import pipeline

    pipe = pipeline("zero-shot-classification", model=str(model), device="cpu")
    if "max_len" in kw:
        pipe.tokenizer.model_max_length = kw.pop("max_len")
    return [pipe(t, candidate_labels=labels, **kw) for t in texts]


def assert_same(served: list[dict[str, Any]], ref: list[Any]) -> None:
    assert [r["labels"] for r in served] == [r["labels"] for r in ref]
    np.testing.assert_allclose([r["scores"] for r in served], [r["scores"] for r in ref], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("multi_label", [False, True])
def test_nli_equals_the_pipeline(nli: Any, nli_model: Path, multi_label: bool) -> None:
    reply = call(nli, {"inputs": TEXTS, "labels": LABELS, "multi_label": multi_label})
    ref = pipeline_results(nli_model, TEXTS, LABELS, multi_label=multi_label)
    assert_same(reply["results"], ref)
    assert reply["model"] == "tiny/zero_shot" and reply["usage"]["tokens"] > 16 * 8
    if not multi_label:
        np.testing.assert_allclose([sum(r["scores"]) for r in reply["results"]], 1.0, 1e-6)
    # a single label is scored on its own (entailment against contradiction)
    one = call(nli, {"inputs": TEXTS[0], "labels": ["dog"]}, Encoding.MSGPACK)
    assert_same(one["results"], pipeline_results(nli_model, TEXTS[:1], ["dog"]))


def test_nli_template_and_truncation_equal_the_pipeline(nli_model: Path) -> None:
    template = "The topic is {}."
    adapter = make_family(
        "zero_shot", nli_model, max_seq_len=12, options={"hypothesis_template": template}
    )
    long = " ".join(TEXTS * 4)
    reply = call(adapter, {"inputs": [long, TEXTS[1]], "labels": LABELS})
    ref = pipeline_results(
        nli_model, [long, TEXTS[1]], LABELS, hypothesis_template=template, max_len=12
    )
    assert_same(reply["results"], ref)
    # a hypothesis longer than the limit on its own: both sides are cut, no error
    huge = " ".join(["dog"] * 20)
    reply = call(adapter, {"inputs": long, "labels": ["cat", huge]})
    assert sorted(reply["results"][0]["labels"]) == ["cat", huge]
    assert reply["usage"]["tokens"] == 2 * 12


@pytest.mark.parametrize("method", ["nli", "embedder"])
def test_requests_with_different_labels_batch_together(
    method: str, request: pytest.FixtureRequest
) -> None:
    adapter = request.getfixturevalue(method)
    bodies = [
        {"inputs": TEXTS[:2], "labels": LABELS},
        {"inputs": TEXTS[2], "labels": ["river", "bank"], "multi_label": True},
        {"inputs": TEXTS, "labels": ["cat", "dog", "money"]},
    ]
    alone = [call(adapter, b) for b in bodies]
    together = call_together(adapter, bodies)
    for a, t in zip(alone, together, strict=True):
        assert [r["labels"] for r in a["results"]] == [r["labels"] for r in t["results"]]
        for ra, rt in zip(a["results"], t["results"], strict=True):
            np.testing.assert_allclose(ra["scores"], rt["scores"], atol=1e-5)


def test_threshold_drops_low_labels(nli: Any) -> None:
    full = call(nli, {"inputs": TEXTS, "labels": LABELS, "multi_label": True})["results"]
    cut = float(np.median([s for r in full for s in r["scores"]]))
    kept = call(nli, {"inputs": TEXTS, "labels": LABELS, "multi_label": True, "threshold": cut})
    for f, k in zip(full, kept["results"], strict=True):
        n = sum(s >= cut for s in f["scores"])
        assert k == {"labels": f["labels"][:n], "scores": f["scores"][:n]}


def test_embedding_label_cache_gives_the_same_scores(embedder: Any) -> None:
    labels = ["vector search", "river water"]
    body = {"inputs": TEXTS, "labels": labels}
    first = call(embedder, body)
    prepared = embedder.preprocess(embedder_env(embedder), _json(body))
    assert len(prepared.items) == len(TEXTS)  # the labels' vectors came from the cache
    again = call(embedder, body)
    assert again["usage"] == first["usage"]  # cached labels still count
    for a, b in zip(first["results"], again["results"], strict=True):
        assert a["labels"] == b["labels"]
        np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-6)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": "the cat"}, "labels"),
        ({"inputs": "the cat", "labels": []}, "labels"),
        ({"inputs": "the cat", "labels": ["dog", ""]}, "labels[1]"),
        ({"inputs": "the cat", "labels": ["dog", "cat", "dog"]}, "labels[2]"),
        ({"inputs": [], "labels": ["dog"]}, "inputs"),
        ({"inputs": ["the cat", ""], "labels": ["dog"]}, "inputs[1]"),
        ({"inputs": "the cat", "labels": "dog"}, "labels"),
    ],
)
def test_bad_input_names_the_field(nli: Any, body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        call(nli, body)
    assert info.value.field == field


def test_bad_specs_fail_at_load(nli_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="method"):
        make_family("zero_shot", nli_model, options={"method": "vibes"})
    with pytest.raises(ValueError, match="hypothesis_template"):
        make_family("zero_shot", nli_model, options={"hypothesis_template": "no slot"})
    assert nli_classes({"contradiction": 0, "neutral": 1, "entailment": 2}) == (2, 0)
    assert nli_classes({"ENTAILMENT": 0, "not_entailment": 1}) == (0, 1)
    assert nli_classes({"not_entailment": 0, "entailment": 1}) == (1, 0)
    with pytest.raises(ValueError, match="entailment"):
        nli_classes({"LABEL_0": 0, "LABEL_1": 1})


@pytest.mark.slow
def test_minilm_embedding_zero_shot_picks_the_topic() -> None:
    spec = Catalog.load().get(EMBED_REAL)
    path = resolve(spec.id, spec.sources, HF_CACHE)
    adapter = make_family("zero_shot", path, **_spec_dict(spec))
    texts = [
        "The team won the match in overtime",
        "Stocks fell sharply after the central bank raised interest rates",
        "Whisk the eggs and sugar, then fold in the flour",
    ]
    want = ["sports", "finance", "cooking"]
    single = call(adapter, {"inputs": texts, "labels": ["finance", "cooking", "sports"]})
    assert [r["labels"][0] for r in single["results"]] == want
    assert all(r["scores"][0] > 0.8 for r in single["results"])
    multi = call(adapter, {"inputs": texts, "labels": want, "multi_label": True})
    for topic, r in zip(want, multi["results"], strict=True):
        got = dict(zip(r["labels"], r["scores"], strict=True))
        assert got[topic] > 0.5 > max(s for label, s in got.items() if label != topic)


def _spec_dict(spec: Any) -> dict[str, Any]:
    return {
        "id": spec.id,
        "max_seq_len": spec.max_seq_len,
        "pooling": spec.pooling,
        "options": spec.options,
    }


def embedder_env(adapter: Any) -> Any:
    from ..tiny_extract import envelope

    return envelope(adapter.spec.id)


def _json(body: dict[str, Any]) -> bytes:
    import msgspec

    return msgspec.json.encode(body)


@pytest.mark.parametrize("runtime", [onnx_runtime, openvino_runtime], ids=["onnx", "openvino"])
@pytest.mark.parametrize("method", ["nli", "embedding"])
def test_onnx_and_openvino_runtimes_give_the_same_scores(
    method: str, runtime: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    torch_adapter = request.getfixturevalue("nli" if method == "nli" else "embedder")
    other = make_family(
        "zero_shot", torch_adapter.path, runtime=runtime(tmp_path), options={"method": method}
    )
    body = {"inputs": TEXTS, "labels": LABELS}
    for a, b in zip(
        call(other, body)["results"], call(torch_adapter, body)["results"], strict=True
    ):
        assert a["labels"] == b["labels"]
        np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-4)


def test_http_extract(nli_model: Path, nli: Any, tmp_path: Path) -> None:
    import httpx

    from ..conftest import ServerThread, tiny_settings
    from ..tinymodels import write_spec

    write_spec(tmp_path, "tiny/zero_shot", nli_model, family="zero_shot", max_seq_len=128)
    srv = ServerThread(tiny_settings(tmp_path, models="tiny/zero_shot")).start()
    body = {"inputs": TEXTS, "labels": LABELS, "multi_label": True}
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/extract/tiny/zero_shot", json=body)
            assert r.status_code == 200, r.text
            want = call(nli, body)
            got = r.json()
            assert [x["labels"] for x in got["results"]] == [x["labels"] for x in want["results"]]
            for g, w in zip(got["results"], want["results"], strict=True):
                np.testing.assert_allclose(g["scores"], w["scores"], atol=1e-5)
            r = c.post("/v1/extract/tiny/zero_shot", json={"inputs": TEXTS})
            assert r.status_code == 400 and r.json()["error"]["field"] == "labels"
    finally:
        srv.stop()
