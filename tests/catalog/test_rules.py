"""Rules where nothing is tuned: precision from the features, the fallback chain."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve.catalog import ModelSpec
from fleetserve.catalog.hardware import Hardware
from fleetserve.catalog.profiles import evidence_table
from fleetserve.catalog.rules import (
    class_precision,
    fallback_chain,
    openvino_installed,
    rule_profile,
)

CPU = Hardware("cpu", "x86_64", "Test CPU", 2, 8 * 2**30, frozenset({"avx2"}))


def spec(**extra: Any) -> ModelSpec:
    return ModelSpec.from_dict({"id": "o/m", "sources": ["/w"], "family": "dense", **extra})


@pytest.mark.parametrize(
    ("cls", "precision"),
    [
        ("cpu-amx", "bf16"),
        ("cpu-avx512fp16", "fp16"),
        ("cpu-avx512bf16", "fp32"),
        ("cpu-avx512", "fp32"),
        ("cpu-avx2", "fp32"),
        ("cpu-arm64", "fp32"),
        ("cuda-sm90", "fp16"),
    ],
)
def test_the_rule_precision_follows_the_features(cls: str, precision: str) -> None:
    assert class_precision(cls) == precision
    prof, why = rule_profile(spec(), CPU, cls)
    assert prof.precision == precision and prof.hardware == cls
    assert precision in why


def test_the_fallback_chain_never_crosses_a_feature_that_changes_the_winner() -> None:
    assert fallback_chain("cpu-amx") == ()
    assert fallback_chain("cpu-avx512fp16") == ()
    assert fallback_chain("cpu-avx512bf16") == ("cpu-avx512", "cpu-avx2", "cpu-generic")
    assert fallback_chain("cpu-avx2") == ("cpu-generic",)
    assert fallback_chain("cpu-arm64") == ()
    assert fallback_chain("cuda-sm89") == tuple(f"cuda-sm8{m}" for m in range(8, -1, -1))
    assert fallback_chain("cuda-sm90") == ()


def test_the_spec_budgets_give_batch_sizes_and_may_state_a_precision() -> None:
    s = spec(budgets={"cpu": {"max_batch_tokens": 1024, "max_batch_size": 8},
                      "cuda": {"precision": "bf16", "max_batch_size": 256}})  # fmt: skip
    cpu, _ = rule_profile(s, CPU, "cpu-avx2")
    assert (cpu.max_batch_tokens, cpu.max_batch_size, cpu.precision) == (1024, 8, "fp32")
    gpu, why = rule_profile(s, CPU, "cuda-sm80")
    assert (gpu.precision, gpu.max_batch_size) == ("bf16", 256)
    assert "spec" in why


def test_generation_stays_fp32_on_cpus_and_onnx_never_gets_bf16() -> None:
    gen, _ = rule_profile(spec(family="generate"), CPU, "cpu-amx")
    assert gen.precision == "fp32" and gen.runtime == ""
    assert gen.max_batch_size == 8  # the family's default sequences
    onnx, _ = rule_profile(spec(runtime="onnx", family="image"), CPU, "cpu-amx")
    assert onnx.precision == "fp32"


def test_openvino_on_amx_for_the_families_it_runs() -> None:
    """From the bundled evidence: OpenVINO won the cpu-amx encoder tunes."""
    table = evidence_table()
    dense, _ = rule_profile(spec(), CPU, "cpu-amx", table)
    image, _ = rule_profile(spec(family="image"), CPU, "cpu-amx", table)
    assert dense.runtime == ("openvino" if openvino_installed() else "")
    assert image.runtime == ""  # image models need the torch module
    bare, why = rule_profile(spec(), CPU, "cpu-amx")  # no evidence: the spec's runtime
    assert bare.runtime == "" and "bf16 for cpu-amx" in why
