"""Token-classification NER against transformers' pipeline on the same tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.families.ner_spans import Span, aggregate, merge_overlapping
from fleetserve.wire import Encoding, InvalidInput

from ..tiny_extract import (
    build_token_classifier,
    call,
    call_together,
    make_family,
    onnx_runtime,
    openvino_runtime,
)

TEXTS = [
    "Hello world, the quick brown fox jumps over the lazy zebra dog",
    "A cat sat on the mat",
    "Fleet serve: small OPEN models, vector search and a river bank of money.",
    "xylophone quizzically",  # all subwords
]
BIO = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
PLAIN = ["O", "PER", "ORG", "LOC"]  # IOB1-style plain tags


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_token_classifier(tmp_path_factory.mktemp("ner"), labels=BIO, seed=1)


@pytest.fixture(scope="module")
def adapter(model: Path) -> Any:
    return make_family("ner", model)


def pipeline_spans(model: Path, texts: list[str], strategy: str, **kw: Any) -> list[Any]:
    from transformers import pipeline

    pipe = pipeline("ner", model=str(model), aggregation_strategy=strategy, device="cpu")
    if "max_len" in kw:
        pipe.tokenizer.model_max_length = kw.pop("max_len")
    return [pipe(t, **kw) for t in texts]


def assert_same(served: list[list[dict[str, Any]]], ref: list[Any], texts: list[str]) -> None:
    assert len(served) == len(ref)
    for text, mine, theirs in zip(texts, served, ref, strict=True):
        assert [(e["start"], e["end"], e["label"]) for e in mine] == [
            (int(e["start"]), int(e["end"]), e["entity_group"]) for e in theirs
        ]
        assert all(e["text"] == text[e["start"] : e["end"]] for e in mine)
        np.testing.assert_allclose(
            [e["score"] for e in mine], [float(e["score"]) for e in theirs], atol=1e-4
        )


@pytest.mark.parametrize("strategy", ["simple", "first", "average", "max"])
def test_spans_equal_the_pipeline(model: Path, strategy: str) -> None:
    adapter = make_family("ner", model, options={"aggregation": strategy})
    reply = call(adapter, {"inputs": TEXTS})
    assert reply["model"] == "tiny/ner" and reply["usage"]["tokens"] > len(TEXTS) * 2
    assert sum(len(r) for r in reply["results"]) > 8  # the random head does find spans
    assert_same(reply["results"], pipeline_spans(model, TEXTS, strategy), TEXTS)


@pytest.mark.parametrize("strategy", ["simple", "first"])
def test_plain_tags_equal_the_pipeline(tmp_path: Path, strategy: str) -> None:
    model = build_token_classifier(tmp_path, labels=PLAIN, seed=2)
    adapter = make_family("ner", model, options={"aggregation": strategy})
    reply = call(adapter, {"inputs": TEXTS})
    assert {e["label"] for r in reply["results"] for e in r} <= {"PER", "ORG", "LOC"}
    assert_same(reply["results"], pipeline_spans(model, TEXTS, strategy), TEXTS)


def test_long_text_windows_equal_the_strided_pipeline(model: Path) -> None:
    text = " ".join(TEXTS * 3)
    adapter = make_family("ner", model, max_seq_len=16, options={"stride": 5})
    reply = call(adapter, {"inputs": [text, "the cat"]})
    ref = pipeline_spans(model, [text, "the cat"], "simple", max_len=16, stride=5)
    assert_same(reply["results"], ref, [text, "the cat"])
    assert reply["results"][0][-1]["end"] > len(text) - 5  # the end of the text is reached


def test_msgpack_reply_and_threshold(adapter: Any) -> None:
    everything = call(adapter, {"inputs": TEXTS[0]}, Encoding.MSGPACK)["results"][0]
    cut = float(np.median([e["score"] for e in everything]))
    kept = call(adapter, {"inputs": TEXTS[0], "threshold": cut})["results"][0]
    assert kept == [e for e in everything if e["score"] >= cut]
    assert 0 < len(kept) < len(everything)


def assert_close(a: list[list[dict[str, Any]]], b: list[list[dict[str, Any]]]) -> None:
    """The same spans, with scores equal up to batch padding's rounding."""
    assert [[(e["start"], e["end"], e["label"]) for e in r] for r in a] == [
        [(e["start"], e["end"], e["label"]) for e in r] for r in b
    ]
    got, want = ([e["score"] for r in x for e in r] for x in (a, b))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_requests_batched_together_equal_separate(adapter: Any) -> None:
    bodies = [{"inputs": TEXTS[:2]}, {"inputs": TEXTS[2:]}, {"inputs": "the dog"}]
    together = call_together(adapter, bodies)
    for body, reply in zip(bodies, together, strict=True):
        assert_close(reply["results"], call(adapter, body)["results"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": []}, "inputs"),
        ({"inputs": ["the cat", ""]}, "inputs[1]"),
        ({"inputs": ["the cat", "  "]}, "inputs[1]"),
        ({"inputs": "the cat", "threshold": 1.5}, "threshold"),
        ({"inputs": 3}, "inputs"),
        ({"labels": ["PER"]}, "inputs"),
    ],
)
def test_bad_input_names_the_field(adapter: Any, body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        call(adapter, body)
    assert info.value.field == field


def test_bad_spec_options_fail_at_load(model: Path) -> None:
    with pytest.raises(ValueError, match="aggregation"):
        make_family("ner", model, options={"aggregation": "longest"})
    with pytest.raises(ValueError, match="stride"):
        make_family("ner", model, max_seq_len=16, options={"stride": 14})


def test_b_tags_split_and_overlaps_keep_the_longer_span() -> None:
    labels = ["O", "B-PER", "I-PER"]
    probs = np.eye(3)[[1, 2, 1, 0, 2]] * 0.9 + 0.1 / 3  # B I B O I
    offsets = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    got = aggregate(probs, offsets, [0, 1, 2, 3, 4], labels, "simple")
    assert [(s.start, s.end, s.label) for s in got] == [
        (0, 3, "PER"),
        (4, 5, "PER"),
        (6, 7, "O"),
        (8, 9, "PER"),  # an I- after O opens a span (IOB1)
    ]
    spans = [Span(0, 5, "A", 0.5), Span(2, 9, "B", 0.4), Span(2, 9, "C", 0.6), Span(10, 12, "D", 1)]
    assert [s.label for s in merge_overlapping(spans)] == ["C", "D"]


def test_a_model_without_tokenizer_json_gets_a_converted_one(model: Path, tmp_path: Path) -> None:
    import shutil

    slow = tmp_path / "slow"
    shutil.copytree(model, slow)
    (slow / "tokenizer.json").unlink()  # as in repositories that ship only vocab.txt
    body = {"inputs": TEXTS}
    assert_close(
        call(make_family("ner", slow), body)["results"],
        call(make_family("ner", model), body)["results"],
    )


@pytest.mark.parametrize("runtime", [onnx_runtime, openvino_runtime], ids=["onnx", "openvino"])
def test_onnx_and_openvino_runtimes_give_the_same_spans(
    runtime: Any, model: Path, adapter: Any, tmp_path: Path
) -> None:
    other = make_family("ner", model, runtime=runtime(tmp_path))
    assert_close(
        call(other, {"inputs": TEXTS})["results"], call(adapter, {"inputs": TEXTS})["results"]
    )


def test_http_extract(model: Path, adapter: Any, tmp_path: Path) -> None:
    import httpx
    import msgspec

    from ..conftest import ServerThread, tiny_settings
    from ..tinymodels import write_spec

    write_spec(tmp_path, "tiny/ner", model, family="ner", pooling="none", max_seq_len=128)
    srv = ServerThread(tiny_settings(tmp_path, models="tiny/ner")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/extract/tiny/ner", json={"inputs": TEXTS})
            assert r.status_code == 200, r.text
            assert_close(r.json()["results"], call(adapter, {"inputs": TEXTS})["results"])
            mp = {"content-type": "application/msgpack", "accept": "application/msgpack"}
            body = msgspec.msgpack.encode({"inputs": TEXTS[1]})
            r = c.post("/v1/extract/tiny/ner", content=body, headers=mp)
            assert r.status_code == 200
            got = msgspec.msgpack.decode(r.content)["results"]
            assert_close(got, call(adapter, {"inputs": TEXTS[1]})["results"])
            r = c.post("/v1/extract/tiny/ner", json={"inputs": ["the cat", ""]})
            assert r.status_code == 400 and r.json()["error"]["field"] == "inputs[1]"
    finally:
        srv.stop()
