"""GLiNER span NER against the real gliner package's predictions.

``data/gliner-tiny/`` holds two tiny random GLiNER checkpoints in gliner's own layout
(BERT with a projection and pytorch_model.bin; DeBERTa-v2 with a SentencePiece-style
tokenizer and model.safetensors) and ``expected.json``: gliner 0.2.29's own entities
(transformers 5.16.1) for several texts, label sets, thresholds, flat/nested and
multi-label decoding, and subtoken poolings. Regenerate them with
``data/make_gliner_fixture.py`` in a separate venv (see its docstring).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from fleetserve.catalog import ModelSpec
from fleetserve.families.gliner_decode import greedy, split_words
from fleetserve.families.span_ner import SpanNerFamily
from fleetserve.runtimes.torch import TorchRuntime
from fleetserve.wire import Encoding, Envelope, InvalidInput, Task

DATA = Path(__file__).parent / "data" / "gliner-tiny"
EXPECTED = json.loads((DATA / "expected.json").read_text())
CASES = EXPECTED["cases"]


def make(path: Path, precision: str = "fp32", **options: Any) -> SpanNerFamily:
    spec = ModelSpec.from_dict(
        {"id": "tiny/gliner", "family": "span_ner", "sources": [str(path)], "options": options}
    )
    adapter = SpanNerFamily(spec, TorchRuntime("cpu", precision), path)
    adapter.load()
    return adapter


def envelope(enc: Encoding = Encoding.JSON) -> Envelope:
    return Envelope("r1", "tiny/gliner", Task.EXTRACT, enc, enc, 1, time.time() + 60)


def together(adapter: SpanNerFamily, bodies: list[dict[str, Any]]) -> list[Any]:
    """Several requests whose items go through ONE forward call, as the worker batches."""
    env = envelope()
    prepared = [adapter.preprocess(env, json.dumps(b).encode()) for b in bodies]
    items = [it for p in prepared for it in p.items]
    outputs = list(adapter.forward(items))
    assert len(outputs) == len(items)
    replies, k = [], 0
    for p in prepared:
        part, k = outputs[k : k + len(p.items)], k + len(p.items)
        replies.append(json.loads(adapter.postprocess(env, p, part)))
    return replies


def call(adapter: SpanNerFamily, body: dict[str, Any]) -> Any:
    return together(adapter, [body])[0]


@pytest.fixture(scope="module")
def models() -> dict[str, SpanNerFamily]:
    return {name: make(DATA / name) for name in ("bert", "deberta")}


def assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [(e["start"], e["end"], e["text"], e["label"]) for e in got] == [
        (e["start"], e["end"], e["text"], e["label"]) for e in want
    ]
    for mine, theirs in zip(got, want, strict=True):
        assert mine["score"] == pytest.approx(theirs["score"], abs=1e-4)


def case_bodies(case: dict[str, Any]) -> tuple[list[int], list[dict[str, Any]]]:
    """One request per text with its own labels (per-text cases), else one for all texts.

    gliner answers [] for blank texts; fleetserve answers 400 (tested below)."""
    kw = {k: case[k] for k in ("threshold", "flat_ner", "multi_label")}
    keep = [i for i, t in enumerate(case["texts"]) if t.strip()]
    if isinstance(case["labels"][0], list):
        return keep, [{"inputs": case["texts"][i], "labels": case["labels"][i], **kw} for i in keep]
    return keep, [{"inputs": [case["texts"][i] for i in keep], "labels": case["labels"], **kw}]


@pytest.mark.parametrize("n", range(len(CASES)))
def test_entities_equal_gliner(models: dict[str, SpanNerFamily], tmp_path: Path, n: int) -> None:
    case = CASES[n]
    adapter = models[case["model"]]
    if "pooling" in case:  # the same weights with another subtoken pooling
        shutil.copytree(DATA / case["model"], tmp_path / "m")
        cfg = json.loads((tmp_path / "m" / "gliner_config.json").read_text())
        cfg["subtoken_pooling"] = case["pooling"]
        (tmp_path / "m" / "gliner_config.json").write_text(json.dumps(cfg))
        adapter = make(tmp_path / "m")
    keep, bodies = case_bodies(case)
    got = [r for reply in together(adapter, bodies) for r in reply["results"]]
    assert len(got) == len(keep)
    for i, text in enumerate(case["texts"]):
        if i not in keep:
            assert case["expected"][i] == [] and not split_words(text)[0]
    for i, results in zip(keep, got, strict=True):
        assert_same(results, case["expected"][i])


def test_fixture_is_not_trivial() -> None:
    counts = [len(r) for c in CASES for r in c["expected"]]
    assert sum(counts) > 300 and sum(1 for n in counts if n == 0) <= len(CASES)
    labels = {e["label"] for c in CASES for r in c["expected"] for e in r}
    assert len(labels) >= 5
    nested = CASES[2]["expected"][1]  # nested decoding keeps spans inside others
    assert any(
        a["start"] <= b["start"] and b["end"] <= a["end"] for a in nested for b in nested if a != b
    )


def test_requests_with_different_labels_share_a_forward(models: dict[str, SpanNerFamily]) -> None:
    adapter = models["bert"]
    a = {"inputs": ["John Smith works at Google in New York."], "labels": ["person", "city"]}
    b = {
        "inputs": ["Mary Jones was born in Paris on 3 March 1990, and visited London.", "hi"],
        "labels": ["date", "location", "person", "organization"],
        "threshold": 0.3,
        "flat_ner": False,
    }
    alone = [call(adapter, a), call(adapter, b)]
    assert sum(len(r) for reply in alone for r in reply["results"]) > 5
    batched = together(adapter, [a, b])
    for x, y in zip(alone, batched, strict=True):
        assert x["usage"] == y["usage"]
        for r1, r2 in zip(x["results"], y["results"], strict=True):
            assert_same(r2, r1)
    assert {e["label"] for e in batched[0]["results"][0]} <= {"person", "city"}


def test_checkpoint_without_encoder_config_or_tokenizer(tmp_path: Path) -> None:
    """Older checkpoints name the encoder by hub id only: options.encoder supplies its
    config and tokenizer, here from the Hugging Face cache that holds the checkpoint."""
    hub = tmp_path / "hub"
    ckpt = hub / "models--org--gliner" / "snapshots" / "abc"
    shutil.copytree(DATA / "bert", ckpt)
    shutil.copytree(DATA / "encoder-bert", hub / "models--org--enc" / "snapshots" / "def")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (ckpt / name).unlink()
    cfg = json.loads((ckpt / "gliner_config.json").read_text())
    cfg["encoder_config"] = None
    (ckpt / "gliner_config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileNotFoundError, match=r"options\.encoder"):
        make(ckpt)
    adapter = make(ckpt, encoder="hf:org/enc")
    keep, bodies = case_bodies(CASES[0])
    for i, results in zip(keep, call(adapter, bodies[0])["results"], strict=True):
        assert_same(results, CASES[0]["expected"][i])
    # a complete checkpoint never looks at options.encoder
    assert make(DATA / "bert", encoder=str(tmp_path / "absent")).cfg is not None


def test_long_text_is_cut_to_the_token_limit(models: dict[str, SpanNerFamily]) -> None:
    adapter = models["bert"]  # 128 positions
    words = ("Mary visited Paris and London with John " * 40).split()
    body = {"labels": ["person", "location"], "threshold": 0.3}
    full = call(adapter, {"inputs": " ".join(words), **body})
    (item,) = adapter.preprocess(
        envelope(), json.dumps({"inputs": " ".join(words), **body}).encode()
    ).items
    assert len(item.ids) <= 128 and 0 < item.num_words < len(words)
    cut = " ".join(words[: item.num_words])
    assert full["results"] == call(adapter, {"inputs": cut, **body})["results"]
    assert all(e["end"] <= len(cut) for e in full["results"][0])


def test_msgpack_reply(models: dict[str, SpanNerFamily]) -> None:
    adapter = models["deberta"]
    body = {"inputs": "Mary Jones visited London.", "labels": ["person", "location"]}
    env = envelope(Encoding.MSGPACK)
    prepared = adapter.preprocess(env, msgspec.msgpack.encode(body))
    reply = msgspec.msgpack.decode(
        adapter.postprocess(env, prepared, list(adapter.forward(prepared.items)))
    )
    assert reply == call(adapter, body)
    assert reply["model"] == "tiny/gliner" and reply["usage"]["tokens"] == len(
        prepared.items[0].ids
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": ["a"]}, "labels"),
        ({"inputs": ["a"], "labels": []}, "labels"),
        ({"inputs": ["a"], "labels": ["person", " "]}, "labels[1]"),
        ({"inputs": ["a"], "labels": ["<<ENT>>"]}, "labels[0]"),
        ({"inputs": ["a"], "labels": ["x"], "threshold": 0}, "threshold"),
        ({"inputs": ["a"], "labels": ["x"], "threshold": 1}, "threshold"),
        ({"inputs": ["a"], "labels": ["x"], "threshold": 1.5}, "threshold"),
        ({"inputs": ["a", ""], "labels": ["x"]}, "inputs[1]"),
        ({"inputs": ["a", "b", " \n "], "labels": ["x"]}, "inputs[2]"),
        ({"inputs": [], "labels": ["x"]}, "inputs"),
        ({"inputs": ["a"], "labels": ["person " * 200]}, "labels"),  # prompt alone too long
    ],
)
def test_bad_input(models: dict[str, SpanNerFamily], body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        models["bert"].preprocess(envelope(), json.dumps(body).encode())
    assert err.value.field == field


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("span_mode", "token_level", "span_mode='token_level'"),
        ("labels_encoder", "BAAI/bge-small-en-v1.5", "labels_encoder="),
        ("class_token_index", 3, "tokenizer does not match"),
    ],
)
def test_unsupported_checkpoint(tmp_path: Path, key: str, value: Any, error: str) -> None:
    shutil.copytree(DATA / "deberta", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "gliner_config.json").read_text())
    cfg[key] = value
    (tmp_path / "m" / "gliner_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=error):
        make(tmp_path / "m")


def test_word_without_tokens_keeps_the_others_aligned(models: dict[str, SpanNerFamily]) -> None:
    """BERT's normalizer drops a lone control character: that word gets no token."""
    adapter = models["bert"]
    body = {"labels": ["person", "location"], "threshold": 0.3}
    (item,) = adapter.preprocess(
        envelope(), json.dumps({"inputs": "Mary \x07 Paris", **body}).encode()
    ).items
    assert item.num_words == 3 and sorted(set(item.words_mask)) == [0, 1, 3]
    (found,) = call(adapter, {"inputs": "Mary \x07 Paris", **body})["results"]
    assert all(e["text"] == "Mary \x07 Paris"[e["start"] : e["end"]] for e in found)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_encoder(models: dict[str, SpanNerFamily], precision: str) -> None:
    """The encoder runs in half precision (fp16 weights, or bf16 autocast on CPU); the
    GLiNER head stays in float32. Same spans, scores close to fp32."""
    body = {"inputs": CASES[0]["texts"][:3], "labels": CASES[0]["labels"], "threshold": 0.3}
    half = make(DATA / "bert", precision=precision)
    assert half.model.project_start[0].weight.dtype == torch.float32
    want = torch.float16 if precision == "fp16" else torch.float32
    assert half.model.encoder.get_input_embeddings().weight.dtype == want

    def scores(adapter: SpanNerFamily) -> dict[tuple[int, int, int, str], float]:
        found = call(adapter, body)["results"]
        return {
            (i, e["start"], e["end"], e["label"]): e["score"]
            for i, r in enumerate(found)
            for e in r
        }

    ref, got = scores(models["bert"]), scores(half)
    assert got.keys() == ref.keys() and len(ref) > 10
    diff = [abs(got[k] - ref[k]) for k in ref]
    assert 0 < max(diff) < 0.01


def _gliner_greedy(spans: list[Any], flat: bool, multi: bool) -> list[Any]:
    """gliner's decoding.utils has_overlapping / has_overlapping_nested, verbatim logic."""

    def clash(a: Any, b: Any) -> bool:
        if a[:2] == b[:2]:
            return not multi
        disjoint = a[0] > b[1] or b[0] > a[1]
        nested = (a[0] <= b[0] and a[1] >= b[1]) or (b[0] <= a[0] and b[1] >= a[1])
        return not disjoint if flat else not (disjoint or nested)

    kept: list[Any] = []
    for span in sorted(spans, key=lambda x: -x[3]):
        if not any(clash(span, k) for k in kept):
            kept.append(span)
    return sorted(kept, key=lambda x: x[0])


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize("multi", [True, False])
def test_greedy_decoding_matches_gliner(flat: bool, multi: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        idx = np.stack([rng.integers(0, 15, n), rng.integers(0, 6, n), rng.integers(0, 3, n)], 1)
        idx = np.unique(idx, axis=0)  # one candidate per (start, width, label), in that order
        scores = rng.choice([0.5, 0.6, 0.7, 0.8, 0.9], len(idx)).astype(np.float32)  # ties too
        rows = zip(idx.tolist(), scores.tolist(), strict=True)
        spans = [(s, s + k, c, p) for (s, k, c), p in rows]
        want = _gliner_greedy(spans, flat, multi)
        assert greedy(idx, scores, flat=flat, multi_label=multi) == want


def test_http_extract(models: dict[str, SpanNerFamily], tmp_path: Path) -> None:
    """Through a real server: concurrent requests with different label sets, both
    encodings, and a 400 without labels."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from ..conftest import ServerThread, tiny_settings
    from ..tinymodels import write_spec

    write_spec(
        tmp_path, "tiny/gliner", DATA / "bert", family="span_ner", pooling="none", max_seq_len=128
    )
    srv = ServerThread(tiny_settings(tmp_path, models="tiny/gliner")).start()
    texts = [t for t in CASES[0]["texts"] if t.strip()]
    label_sets = [["person", "city"], ["organization"], ["date", "location", "person"]]
    bodies = [{"inputs": texts[i % 4 :], "labels": label_sets[i % 3]} for i in range(12)]
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            with ThreadPoolExecutor(6) as pool:
                replies = list(
                    pool.map(lambda b: c.post("/v1/extract/tiny/gliner", json=b), bodies)
                )
            for body, r in zip(bodies, replies, strict=True):
                assert r.status_code == 200, r.text
                want = call(models["bert"], body)
                for got, ref in zip(r.json()["results"], want["results"], strict=True):
                    assert_same(got, ref)
            mp = {"content-type": "application/msgpack", "accept": "application/msgpack"}
            r = c.post(
                "/v1/extract/tiny/gliner", content=msgspec.msgpack.encode(bodies[1]), headers=mp
            )
            assert r.status_code == 200
            got_mp = msgspec.msgpack.decode(r.content)["results"]
            want_mp = call(models["bert"], bodies[1])["results"]
            # the same spans; scores to 1e-4 (batches padded otherwise differ in the last bits)
            for got, ref in zip(got_mp, want_mp, strict=True):
                assert_same(got, ref)
            r = c.post("/v1/extract/tiny/gliner", json={"inputs": ["John"]})
            assert r.status_code == 400 and r.json()["error"]["field"] == "labels"
    finally:
        srv.stop()
