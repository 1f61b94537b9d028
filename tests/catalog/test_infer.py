"""Family and field inference from a model's own files, on tiny models of each family,
and the refusals: undecided, mismatched, remote code, corrupt, unsupported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fleetserve.catalog import ModelSpec
from fleetserve.catalog.infer import (
    CheckpointError,
    CorruptFile,
    FamilyMismatch,
    FamilyUndecided,
    RemoteCode,
    infer,
)
from fleetserve.catalog.infer_fields import Unsupported
from fleetserve.runtimes import Head
from fleetserve.wire import InvalidInput

from ..tiny_colbert import build_hf_colbert, build_pylate_colbert
from ..tiny_extract import NER_LABELS, NLI_LABELS, build_nli_classifier, build_token_classifier
from ..tiny_generate import build_llama
from ..tiny_image import build_clip, build_siglip
from ..tiny_onnx import build_head
from ..tiny_rerank import build_cross_encoder
from ..tiny_st import build_st
from ..tinymodels import build_bert

GLINER = Path(__file__).parents[1] / "families" / "data" / "gliner-tiny" / "bert"


def _edit(path: Path, name: str, **changes: object) -> None:
    file = path / name
    data = json.loads(file.read_text()) if file.is_file() else {}
    data.update(changes)
    file.write_text(json.dumps(data))


# -- each family, with its fields and their evidence ---------------------------------
def test_a_sentence_transformer_is_dense_with_its_pooling_limit_and_prompts(
    tmp_path: Path,
) -> None:
    prompts = {"query": "query: ", "passage": "passage: ", "classification": "topic: "}
    m = build_st(tmp_path / "st", pooling="cls", max_seq_length=384, prompts=prompts)
    got = infer(m)
    assert (got.family, got.runtime, got.pooling, got.normalize) == ("dense", "torch", "cls", True)
    assert (got.max_seq_len, got.dimensions) == (384, 32)
    assert dict(got.options) == {"query_prefix": "query: ", "document_prefix": "passage: "}
    assert got.evidence["family"] == "modules.json: 1_Pooling (a Pooling module)"
    assert got.evidence["pooling"] == "1_Pooling/config.json: pooling_mode_cls_token"
    assert got.evidence["max_seq_len"] == "sentence_bert_config.json: max_seq_length"
    assert got.evidence["normalize"].startswith("modules.json: 2_Normalize")
    assert got.evidence["options.document_prefix"].endswith("prompts.passage")
    # what it gives is a spec ModelSpec reads as is
    spec = ModelSpec.from_dict({"id": "t/st", "sources": [str(m)], **got.spec_fields()})
    assert (spec.pooling, spec.max_seq_len, spec.options["query_prefix"]) == ("cls", 384, "query: ")


def test_the_smallest_limit_wins_and_no_normalize_module_means_raw_vectors(
    tmp_path: Path,
) -> None:
    m = build_st(tmp_path / "st", max_positions=128, max_seq_length=384, normalize=False)
    _edit(m, "tokenizer_config.json", model_max_length=1e30)  # "no limit" is ignored
    got = infer(m)
    assert (got.max_seq_len, got.evidence["max_seq_len"]) == (
        128,
        "config.json: max_position_embeddings",
    )
    assert (
        got.normalize is False and got.evidence["normalize"] == "modules.json: no Normalize module"
    )
    _edit(m, "tokenizer_config.json", model_max_length=100)
    assert infer(m).max_seq_len == 100


def test_roberta_positions_leave_out_the_padding_offset(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    _edit(m, "config.json", model_type="xlm-roberta", max_position_embeddings=514, pad_token_id=1)
    got = infer(m, family="dense")
    assert got.max_seq_len == 512 and "offset of 2" in got.evidence["max_seq_len"]


@pytest.mark.parametrize(
    ("build", "family", "fields"),
    [
        (
            lambda p: build_head(p, Head.MASKED_LM),
            "sparse",
            {"pooling": "none", "normalize": False},
        ),
        (build_hf_colbert, "multivector", {"normalize": True, "dimensions": 16}),
        (build_pylate_colbert, "multivector", {"max_seq_len": 11, "dimensions": 16}),
        (build_cross_encoder, "cross_encoder", {"pooling": "none", "max_seq_len": 128}),
        (build_token_classifier, "ner", {"pooling": "none"}),
        (build_clip, "image", {"pooling": "none", "max_seq_len": 32, "dimensions": 24}),
        (build_siglip, "image", {"max_seq_len": 16, "dimensions": 32}),
        (build_llama, "generate", {"max_seq_len": 256}),
    ],
)
def test_each_family_is_found_by_its_files(
    tmp_path: Path, build: object, family: str, fields: dict[str, object]
) -> None:
    m = build(tmp_path / "m")  # type: ignore[operator]
    got = infer(m)
    assert got.family == family, got.evidence
    assert {k: got.spec_fields().get(k) for k in fields} == fields, got.evidence
    assert set(got.spec_fields()) - {"family", "runtime", "options"} <= set(got.evidence)


def test_token_and_nli_labels_come_from_id2label(tmp_path: Path) -> None:
    ner = infer(build_token_classifier(tmp_path / "ner"))
    assert ner.labels == tuple(NER_LABELS) and ner.evidence["labels"] == "config.json: id2label"
    nli = infer(build_nli_classifier(tmp_path / "nli"))
    assert (nli.family, nli.labels, dict(nli.options)) == (
        "zero_shot",
        tuple(NLI_LABELS),
        {"method": "nli"},
    )
    assert "NLI" in nli.evidence["family"]


def test_gliner_is_span_ner(tmp_path: Path) -> None:
    got = infer(GLINER)
    assert (got.family, got.evidence["family"]) == ("span_ner", "gliner_config.json")
    assert got.max_seq_len == 128  # its encoder's positions


# -- family given: checked, never overridden -----------------------------------------
def test_a_given_family_that_fits_is_kept_and_read_for(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st", max_seq_length=64)
    mv = infer(m, family="multivector")
    assert (mv.family, mv.normalize, mv.max_seq_len) == ("multivector", True, 64)
    zs = infer(m, family="zero_shot")
    assert (zs.family, zs.options["method"], zs.pooling) == ("zero_shot", "embedding", "mean")


@pytest.mark.parametrize(
    ("family", "says"),
    [
        ("cross_encoder", "needs a sequence-classification head"),
        ("ner", "needs a token-classification head"),
        ("generate", "needs a causal LM"),
        ("image", "needs a CLIP or SigLIP model"),
    ],
)
def test_a_given_family_that_does_not_fit_says_why_and_what_fits(
    tmp_path: Path, family: str, says: str
) -> None:
    m = build_st(tmp_path / "st")
    with pytest.raises(FamilyMismatch) as err:
        infer(m, family=family)
    msg = err.value.message
    assert says in msg and "its files fit family dense" in msg and "\n" not in msg, msg
    assert err.value.field == "family" and isinstance(err.value, InvalidInput)


def test_ner_without_id2label_is_refused(tmp_path: Path) -> None:
    m = build_token_classifier(tmp_path / "ner")
    config = json.loads((m / "config.json").read_text())
    del config["id2label"], config["label2id"]
    (m / "config.json").write_text(json.dumps(config))
    for family in (None, "ner"):
        with pytest.raises(FamilyMismatch, match="no id2label"):
            infer(m, family=family)


# -- what the files do not decide, and what is refused -------------------------------
def test_a_bare_encoder_is_undecided_and_names_the_candidates(tmp_path: Path) -> None:
    m = build_bert(tmp_path / "bare")
    with pytest.raises(FamilyUndecided) as err:
        infer(m)
    assert err.value.candidates == ("dense", "multivector", "zero_shot")
    assert "BertModel and no sentence-transformers files" in err.value.message
    assert "--family" in err.value.message and err.value.field == "family"
    assert infer(m, family="dense").pooling == "mean"  # asked for: served so


def test_a_text_classifier_and_a_base_lm_are_undecided(tmp_path: Path) -> None:
    m = build_cross_encoder(tmp_path / "clf", num_labels=2)
    _edit(m, "config.json", id2label={"0": "NEGATIVE", "1": "POSITIVE"})
    with pytest.raises(FamilyUndecided, match="text classifier"):
        infer(m)
    _edit(m, "config_sentence_transformers.json", model_type="CrossEncoder")
    got = infer(m)  # sentence-transformers says what it is
    assert got.family == "cross_encoder" and "model_type CrossEncoder" in got.evidence["family"]
    assert got.labels == ("NEGATIVE", "POSITIVE")
    (m / "config_sentence_transformers.json").unlink()
    lm = build_llama(tmp_path / "lm")
    for name in ("chat_template.jinja",):
        (lm / name).unlink(missing_ok=True)
    _edit(lm, "tokenizer_config.json", chat_template=None)
    with pytest.raises(FamilyUndecided, match="no chat template") as err:
        infer(lm)
    assert err.value.candidates == ("generate",)


@pytest.mark.parametrize(
    ("file", "changes", "says"),
    [
        ("config.json", {"auto_map": {"AutoModel": "modeling_x.XModel"}}, "config.json: auto_map"),
        (
            "sentence_bert_config.json",
            {"model_args": {"trust_remote_code": True}},
            "trust_remote_code",
        ),
    ],
)
def test_remote_code_is_refused_with_the_reason(
    tmp_path: Path, file: str, changes: dict[str, object], says: str
) -> None:
    m = build_st(tmp_path / "st")
    _edit(m, file, **changes)
    for family in (None, "dense"):
        with pytest.raises(RemoteCode) as err:
            infer(m, family=family)
        assert says in err.value.message and "does not run" in err.value.message


def test_a_custom_module_class_is_remote_code(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    mods = json.loads((m / "modules.json").read_text())
    mods[0]["type"] = "custom_st.Transformer"
    (m / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(RemoteCode, match=r"module custom_st\.Transformer"):
        infer(m)


@pytest.mark.parametrize(
    "name", ["config.json", "modules.json", "1_Pooling/config.json", "tokenizer_config.json"]
)
def test_a_corrupt_file_is_one_line_naming_it(tmp_path: Path, name: str) -> None:
    m = build_st(tmp_path / "st")
    (m / name).write_text('{"broken": ')
    with pytest.raises(CorruptFile) as err:
        infer(m)
    assert str(m / name) in err.value.message and "not valid JSON" in err.value.message
    assert "\n" not in err.value.message


def test_no_weights_or_no_directory_is_refused(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    (m / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no weights"):
        infer(m)
    with pytest.raises(CheckpointError, match="not a directory"):
        infer(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("pooling", "says"), [("max", "pooling max"), ("lasttoken", "pooling lasttoken")]
)
def test_a_pooling_fleetserve_does_not_do_is_unsupported(
    tmp_path: Path, pooling: str, says: str
) -> None:
    m = build_st(tmp_path / "st", pooling=pooling)
    with pytest.raises(Unsupported, match=says):
        infer(m)


def test_a_dense_layer_after_pooling_is_unsupported(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    mods = json.loads((m / "modules.json").read_text())
    mods.append(
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    )
    (m / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(Unsupported, match="a Dense module"):
        infer(m)


def test_lowercasing_needs_a_lowercasing_tokenizer(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st")
    _edit(m, "sentence_bert_config.json", do_lower_case=True)
    infer(m)  # the tiny tokenizer lowercases (BertNormalizer)
    tok = json.loads((m / "tokenizer.json").read_text())
    tok["normalizer"] = None
    (m / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(Unsupported, match="do_lower_case"):
        infer(m)


def test_a_copy_of_a_gliner_dir_without_weights_is_refused(tmp_path: Path) -> None:
    m = tmp_path / "g"
    shutil.copytree(GLINER, m)
    (m / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointError, match="has no weights"):
        infer(m)


def test_a_chat_models_sampling_comes_from_its_generation_config(tmp_path: Path) -> None:
    m = build_llama(tmp_path / "lm")
    assert dict(infer(m).options) == {}  # greedy by default: nothing to say
    _edit(m, "generation_config.json", do_sample=True, temperature=0.7, top_p=0.8)
    got = infer(m)
    assert dict(got.options) == {"temperature": 0.7, "top_p": 0.8}
    assert got.evidence["options.top_p"] == "generation_config.json: top_p (do_sample)"
