"""A spec never serves weights that were not in the checkpoint: a load that would leave
any weight newly initialized fails in one line naming the missing pieces and the
family the files fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetserve.runtimes import Head
from fleetserve.runtimes.checked_load import IncompleteCheckpoint, check_loading_info, pieces

from ..tiny_colbert import build_pylate_colbert
from ..tiny_extract import NER_LABELS, make_family
from ..tiny_generate import build_llama, load_adapter
from ..tiny_onnx import build_head
from ..tiny_st import build_st


def _one_line(exc: pytest.ExceptionInfo[IncompleteCheckpoint]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "\x1b" not in msg, msg
    return msg


def test_a_cross_encoder_spec_over_an_embedding_checkpoint_fails_its_load(
    tmp_path: Path,
) -> None:
    m = build_st(tmp_path / "st")
    with pytest.raises(IncompleteCheckpoint) as err:
        make_family("cross_encoder", m)
    msg = _one_line(err)
    assert "no weights for classifier (2 tensors) of the sequence-classification head" in msg
    assert "its files fit family dense (modules.json: 1_Pooling" in msg


def test_a_ner_spec_without_id2label_fails_naming_it(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    with pytest.raises(IncompleteCheckpoint) as err:
        make_family("ner", m)
    msg = _one_line(err)
    assert "config.json has no id2label" in msg and "its files fit family dense" in msg


def test_a_ner_spec_with_labels_but_no_head_fails_naming_the_head(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    config = json.loads((m / "config.json").read_text())
    config["id2label"] = dict(enumerate(NER_LABELS))
    (m / "config.json").write_text(json.dumps(config))
    with pytest.raises(IncompleteCheckpoint) as err:
        make_family("ner", m)
    assert "classifier (2 tensors) of the token-classification head (ner)" in _one_line(err)


def test_a_sparse_spec_over_an_encoder_fails_naming_the_lm_head(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    with pytest.raises(IncompleteCheckpoint) as err:
        make_family("sparse", m, pooling="none")
    assert "cls.predictions" in _one_line(err) and "masked-LM head" in str(err.value)


def test_a_causal_lm_without_its_output_layer_fails(tmp_path: Path) -> None:
    m = build_llama(tmp_path / "lm")  # saved with tied embeddings: no lm_head tensor
    config = json.loads((m / "config.json").read_text())
    config["tie_word_embeddings"] = False  # now it needs one
    (m / "config.json").write_text(json.dumps(config))
    with pytest.raises(IncompleteCheckpoint) as err:
        load_adapter(m)
    msg = _one_line(err)
    assert "no weights for lm_head (1 tensor) of the causal-LM head (generate)" in msg
    assert "its files fit family generate" in msg


def test_the_heads_that_are_there_load(tmp_path: Path) -> None:
    """Controls: complete checkpoints load, and a BERT saved without its pooler (as
    ColBERT and task-head checkpoints are) still serves dense: the pooler is unread."""
    make_family("sparse", build_head(tmp_path / "mlm", Head.MASKED_LM), pooling="none")
    no_pooler = build_pylate_colbert(tmp_path / "colbert")
    make_family("dense", no_pooler, max_seq_len=16)


def test_a_classifier_without_its_pooler_fails(tmp_path: Path) -> None:
    """A sequence-classification head reads BERT's pooler: only encoders may lack it."""
    import torch
    from safetensors.torch import load_file, save_file

    m = build_head(tmp_path / "ce", Head.SEQUENCE_CLASSIFICATION)
    state = load_file(str(m / "model.safetensors"))
    kept = {k: v for k, v in state.items() if ".pooler." not in k}
    save_file({k: torch.clone(v) for k, v in kept.items()}, str(m / "model.safetensors"))
    with pytest.raises(IncompleteCheckpoint, match=r"bert\.pooler \(2 tensors\)"):
        make_family("cross_encoder", m, options={"label_index": 0})


def test_the_report_names_pieces_and_ignores_only_what_is_unread(tmp_path: Path) -> None:
    info = {"missing_keys": ["pooler.dense.weight", "bert.pooler.dense.bias"]}
    check_loading_info(tmp_path, "encoder", info, ("pooler",))  # nothing else missing: fine
    with pytest.raises(IncompleteCheckpoint, match="pooler"):
        check_loading_info(tmp_path, "head", info)
    many = [f"bert.encoder.layer.{i}.attention.self.query.weight" for i in range(5)]
    many += ["classifier.weight", "classifier.bias"]
    assert pieces(many) == "bert.encoder (5 tensors), classifier (2 tensors)"
    with pytest.raises(IncompleteCheckpoint, match="classifier"):
        check_loading_info(
            tmp_path,
            "head",
            {"missing_keys": [], "mismatched_keys": [("classifier.weight", (1, 2), (3, 2))]},
        )
    spread = [f"m{i}.w" for i in range(6)]
    assert pieces(spread).endswith("and 2 more modules")


def test_a_zero_shot_nli_spec_over_an_encoder_says_what_fits(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    with pytest.raises(IncompleteCheckpoint) as err:
        make_family("zero_shot", m, options={"method": "nli"})
    msg = _one_line(err)
    assert "has no entailment class" in msg and "its files fit family dense" in msg


def test_transformers_load_report_gives_way_to_the_one_line(tmp_path: Path) -> None:
    import logging

    import transformers

    from fleetserve.runtimes.checked_load import load_checked

    m = build_st(tmp_path / "st")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        transformers.AutoModelForSequenceClassification.from_pretrained(str(m))
        assert any("LOAD REPORT" in s for s in seen)  # unchecked: transformers reports
        seen.clear()
        with pytest.raises(IncompleteCheckpoint):
            load_checked(transformers.AutoModelForSequenceClassification, m, "head")
        assert not any("LOAD REPORT" in s for s in seen), seen
    finally:
        logger.removeHandler(handler)
