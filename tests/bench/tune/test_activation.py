"""tune.activation: the activation peak of one full batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fleetserve.bench.tune.activation import measure_activation_peak

from ...tinymodels import build_bert


def test_activation_peak_of_a_full_batch_of_a_tiny_dense_model(tmp_path: Path) -> None:
    from fleetserve.catalog import ModelSpec
    from fleetserve.families.dense import DenseFamily
    from fleetserve.runtimes import create_runtime

    model = build_bert(tmp_path / "model", max_positions=512)
    spec = ModelSpec(id="tiny", family="dense", runtime="torch", sources=(str(model),),
                     max_seq_len=512)  # fmt: skip
    adapter = DenseFamily(spec, create_runtime("torch", device="cpu", precision="fp32"), model)
    adapter.load()
    peak = measure_activation_peak(adapter, spec, model, 64 * 512, 64)
    assert peak > 0
    # generation is measured per decode step elsewhere; a broken adapter measures 0
    generate = dataclasses.replace(spec, family="generate")
    assert measure_activation_peak(adapter, generate, model, 256, 8) == 0
    assert measure_activation_peak(object(), spec, model, 256, 8) == 0  # type: ignore[arg-type]
