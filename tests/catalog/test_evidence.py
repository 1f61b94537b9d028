"""The rules' table from the bundled profiles' winners: own class, nearest class by
features, precision this CPU cannot run, families kept apart, and the docs' copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetserve.catalog import ModelSpec
from fleetserve.catalog.evidence import Row, RuleTable, runs_natively
from fleetserve.catalog.hardware import Hardware
from fleetserve.catalog.profiles import evidence_table
from fleetserve.catalog.rules import missing_extra, rule_profile

AMX = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"})
AVX2 = frozenset({"avx2", "fma"})
ZEN4 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16"})
DOC = Path(__file__).parents[2] / "docs" / "tuning.md"


def row(cls: str, model: str, runtime: str, precision: str, ratio: float | None = 2.0,
        family: str = "dense", features: frozenset[str] = AMX) -> Row:  # fmt: skip
    return Row(cls, model, family, runtime, precision, ratio, f"docs/tuning/{model}.md", features)


TABLE = RuleTable(
    [
        row("cpu-amx", "a", "openvino", "bf16", 3.0),
        row("cpu-amx", "b", "openvino", "bf16", 2.9, family="multivector"),
        row("cpu-amx", "c", "openvino", "fp32", 1.2, family="sparse"),
        row("cpu-amx", "g", "torch", "fp32", 1.0, family="generate"),
        row("cpu-avx2", "a", "onnx", "fp32", 1.3, features=AVX2),
    ]
)


def spec(**extra: Any) -> ModelSpec:
    return ModelSpec.from_dict({"id": "o/m", "sources": ["/w"], "family": "dense", **extra})


def hw(features: frozenset[str]) -> Hardware:
    return Hardware("cpu", "x86_64", "Test CPU", 2, 8 * 2**30, features)


def test_a_class_with_rows_takes_what_most_of_them_chose() -> None:
    # NER has no rows of its own on cpu-amx: the encoders' majority decides
    pick = TABLE.pick("ner", "cpu-amx", AMX)
    assert pick is not None
    assert (pick.runtime, pick.precision, pick.source) == ("openvino", "bf16", "cpu-amx")
    assert len(pick.rows) == 3 and "as tuned on cpu-amx" in pick.reason


def test_rows_of_the_models_own_family_decide_where_there_are_some() -> None:
    # bf16 won for the dense rows, but the sparse row's gate kept it at fp32
    sparse = TABLE.pick("sparse", "cpu-amx", AMX)
    assert sparse is not None and (sparse.runtime, sparse.precision) == ("openvino", "fp32")
    assert [r.model for r in sparse.rows] == ["c"]


def test_a_tie_goes_to_the_higher_median_ratio() -> None:
    ov = row("cpu-amx", "b", "openvino", "fp32", 1.8)
    tied = (row("cpu-amx", "a", "torch", "bf16", 1.5), ov)
    assert RuleTable.winner(tied) == ("openvino", "fp32")
    flipped = (row("cpu-amx", "a", "torch", "bf16", 2.5), ov)
    assert RuleTable.winner(flipped) == ("torch", "bf16")


def test_a_class_without_rows_takes_the_nearest_whose_precision_it_runs() -> None:
    # Zen 4 has bf16 but no AMX: as far from cpu-amx as from cpu-avx2 by count, but only
    # the amx winner's bf16 runs natively here, so that one is nearer
    pick = TABLE.pick("dense", "cpu-avx512bf16", ZEN4)
    assert pick is not None and (pick.source, pick.precision) == ("cpu-amx", "bf16")
    # even where the amx machine had many more features than the avx2 one: the native
    # reduced precision counts before the number of features that differ
    big = AMX | {"amx_int8", "amx_tile", "avx512_vnni", "avx512bw", "avx512vl", "avx_vnni"}
    far = RuleTable([row("cpu-amx", "a", "openvino", "bf16", 3.0, features=big),
                     row("cpu-avx2", "a", "onnx", "fp32", 1.3, features=AVX2)])  # fmt: skip
    zen4 = far.pick("dense", "cpu-avx512bf16", ZEN4)
    assert zen4 is not None and (zen4.source, zen4.precision) == ("cpu-amx", "bf16")
    # Skylake (avx512f, no bf16) is nearest to the avx2 rows by features
    sky = TABLE.pick("dense", "cpu-avx512", AVX2 | {"avx512f", "avx512bw"})
    assert sky is not None and (sky.source, sky.runtime) == ("cpu-avx2", "onnx")


def test_a_precision_this_cpu_cannot_run_becomes_fp32_on_the_same_runtime() -> None:
    pick = TABLE.without("cpu-avx2").pick("dense", "cpu-avx2", AVX2)
    assert pick is not None
    assert (pick.source, pick.runtime, pick.precision) == ("cpu-amx", "openvino", "fp32")
    assert "no native bf16" in pick.reason
    assert runs_natively("fp32", ()) and not runs_natively("bf16", AVX2)
    assert runs_natively("bf16", ZEN4) and not runs_natively("fp16", ZEN4)


def test_families_are_kept_apart_and_arm_never_reads_x86_rows() -> None:
    gen = TABLE.pick("generate", "cpu-avx2", AVX2)
    assert gen is not None and (gen.runtime, gen.precision) == ("torch", "fp32")
    assert TABLE.pick("image", "cpu-amx", AMX) is None
    assert TABLE.pick("dense", "cpu-arm64", frozenset({"asimd"})) is None
    assert RuleTable().pick("dense", "cpu-amx", AMX) is None


def test_the_rule_switches_runtime_only_where_the_weights_convert() -> None:
    table = TABLE.without("cpu-avx2")
    dense, why = rule_profile(spec(), hw(AMX), "cpu-amx", table)
    ov = not missing_extra("openvino")
    assert (dense.runtime, dense.precision) == ("openvino" if ov else "", "bf16")
    assert "as tuned on cpu-amx" in why
    onnx, _ = rule_profile(spec(runtime="onnx"), hw(AMX), "cpu-amx", table)
    assert (onnx.runtime, onnx.precision) == (("openvino", "bf16") if ov else ("", "fp32"))
    # the avx2 rows chose onnx: neither a torch nor an OpenVINO model moves to it
    torch_model, _ = rule_profile(spec(), hw(AVX2), "cpu-avx2", TABLE)
    assert (torch_model.runtime, torch_model.precision) == ("", "fp32")
    ov_model, _ = rule_profile(spec(runtime="openvino"), hw(AVX2), "cpu-avx2", TABLE)
    assert ov_model.runtime == ""
    gen, _ = rule_profile(spec(family="generate"), hw(AMX), "cpu-amx", table)
    assert (gen.runtime, gen.precision) == ("", "fp32")
    # a generation tune in evidence decides its precision too (the gate checks tokens)
    fp16_gen = RuleTable([row("cpu-avx2", "g", "torch", "fp16", 2.6, family="generate")])
    gen16, why = rule_profile(spec(family="generate"), hw(AVX2), "cpu-avx2", fp16_gen)
    assert (gen16.runtime, gen16.precision) == ("", "fp16") and "as tuned on" in why
    image, _ = rule_profile(spec(family="image"), hw(AMX), "cpu-amx", table)
    assert (image.runtime, image.precision) == ("", "bf16")  # no evidence: the class's


def test_the_bundled_profiles_make_the_table() -> None:
    table = evidence_table()
    amx = table.pick("dense", "cpu-amx", AMX)
    assert amx is not None and (amx.runtime, amx.precision) == ("openvino", "bf16")
    assert {r.model for r in amx.rows} >= {"sentence-transformers/all-MiniLM-L6-v2"}
    assert all(r.vs_torch_fp32 and r.report.startswith("docs/tuning/") for r in table.rows)
    assert all((DOC.parent / r.report.removeprefix("docs/")).is_file() for r in table.rows)


def test_docs_tuning_shows_the_table_the_bundled_profiles_make() -> None:
    assert evidence_table().markdown() in DOC.read_text()
