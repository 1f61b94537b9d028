"""The quality gate of adapters in a graph with LoRA slots (bench/tune/slot_gate.py):
a seeded adapter on the calibration set, on the slots against the fp32 torch
reference; a pass is kept for the same weights, so the next start compares nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetserve.bench.tune.slot_gate import KEY, SlotGate
from fleetserve.bench.tune.verdicts import Verdicts
from fleetserve.catalog import ModelSpec
from fleetserve.families import create_family
from fleetserve.runtimes import create_runtime

from ...extras import needs
from ...tinymodels import build_bert

pytestmark = [pytest.mark.slow, needs("torch", "openvino", extra="openvino")]


def family(spec: ModelSpec, base: Path, runtime: str, cache: Path, slots: int = 0) -> Any:
    rt = create_runtime(runtime, device="cpu", precision="fp32", cache_dir=cache,
                        adapter_slots=slots)  # fmt: skip
    return create_family(spec, rt, base)


def test_slots_pass_once_and_the_pass_is_kept(tmp_path: Path) -> None:
    base = build_bert(tmp_path / "bert")
    spec = ModelSpec.from_dict({"id": "tiny/bert", "family": "dense", "sources": [str(base)],
                                "pooling": "mean", "max_seq_len": 16})  # fmt: skip
    served = family(spec, base, "openvino", tmp_path / "cache", slots=2)
    served.load()
    served.runtime.prepare_adapters()
    loads: list[int] = []

    def reference() -> Any:
        loads.append(1)
        return family(spec, base, "torch", tmp_path / "cache")

    verdicts = Verdicts(tmp_path / "gate")
    gate = SlotGate(spec, "fp32", reference, lambda: b"weights", verdicts)
    ref = gate.prepare()
    assert ref is not None and gate.passes(served, ref)
    assert KEY not in served.runtime.lora_bank()  # the gate's adapter leaves
    again = SlotGate(spec, "fp32", reference, lambda: b"weights", verdicts)
    assert again.prepare() is None and loads == [1]  # kept: nothing loaded, compared
    other = SlotGate(spec, "fp32", reference, lambda: b"other weights", verdicts)
    assert other.prepare() is not None and loads == [1, 1]
