"""LoRA slots inside an OpenVINO graph (runtimes/openvino_lora.py): rows of one batch
with different adapters, or none, against PEFT running each adapter alone at fp32;
an adapter put into a slot, or taken out, with nothing compiled again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.lora.load import read_adapter
from fleetserve.runtimes import Head, Output
from fleetserve.runtimes.lora_slots import Layout
from fleetserve.runtimes.openvino_lora import SlotModel, convert_slots
from fleetserve.wire import InvalidInput

from ..extras import needs
from ..tiny_lora import make_lora, peft_mean, token_feed
from ..tinymodels import build_bert

pytestmark = [pytest.mark.slow, needs("torch", "peft", extra="train")]

TEXTS = ["the quick brown fox", "hello world", "lazy dog sleeps", "river bank money"]
TARGETS = ("query", "key", "value", "dense")
F32 = {"INFERENCE_PRECISION_HINT": "f32"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], SlotModel]:
    root = tmp_path_factory.mktemp("ov-lora")
    base = build_bert(root / "bert")
    adapters = [  # ranks 4 and 8 in a layout of 16; one targets fewer layers
        make_lora(base, root / "a", seed=1, rank=4, targets=("query", "value", "dense")),
        make_lora(base, root / "b", seed=2, rank=8, alpha=8.0, targets=TARGETS),
    ]
    layout, inputs, outputs = convert_slots(base, Head.BASE, root / "slots.xml", TARGETS, 4, 16)
    model = SlotModel(root / "slots.xml", layout, inputs, outputs, F32)
    return base, adapters, model


def put(model: SlotModel, slot: int, adapter: Path) -> None:
    weights, scaling = read_adapter(adapter)
    model.stacks.put(slot, {m: (a.numpy(), b.numpy()) for m, (a, b) in weights.items()}, scaling)


def feed(base: Path) -> dict[str, Any]:
    return token_feed(base, TEXTS)


def reference(base: Path, adapter: Path | None) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any] = peft_mean(base, adapter, TEXTS)
    return out


def test_each_row_runs_its_own_adapter_as_peft_does(
    built: tuple[Path, list[Path], SlotModel],
) -> None:
    base, (a, b), model = built
    put(model, 1, a)
    put(model, 2, b)
    got = model.run(feed(base), np.array([1, 0, 2, 1]), Output.MEAN)
    want = np.stack([reference(base, a)[0], reference(base, None)[1],
                     reference(base, b)[2], reference(base, a)[3]])  # fmt: skip
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(got[0] - reference(base, None)[0]).max() > 1e-3  # the adapter matters


def test_a_slot_refilled_or_cleared_changes_the_rows_not_the_compiled_model(
    built: tuple[Path, list[Path], SlotModel],
) -> None:
    base, (a, b), model = built
    compiled = model.compiled
    put(model, 3, a)
    first = model.run(feed(base), np.array([3, 3, 3, 3]), Output.MEAN)
    put(model, 3, b)  # another adapter in the same slot: its layers only
    second = model.run(feed(base), np.array([3, 3, 3, 3]), Output.MEAN)
    np.testing.assert_allclose(first, reference(base, a), atol=1e-5)
    np.testing.assert_allclose(second, reference(base, b), atol=1e-5)
    model.stacks.clear(3)
    np.testing.assert_allclose(model.run(feed(base), np.array([3, 0, 3, 0]), Output.MEAN),
                               reference(base, None), atol=1e-5)  # fmt: skip
    assert model.compiled is compiled


def test_what_does_not_fit_the_layout_is_refused(
    built: tuple[Path, list[Path], SlotModel], tmp_path: Path
) -> None:
    base, _, model = built
    big = make_lora(base, tmp_path / "big", rank=32, targets=("query",))
    with pytest.raises(InvalidInput, match="rank 32 is above the slot layout's 16") as err:
        put(model, 1, big)
    assert err.value.field == "rank"
    with pytest.raises(ValueError, match="slot 0"):
        put(model, 0, big)
    layout = Layout({"encoder.layer.0.attention.self.query": (32, 32)}, 2, 4)
    assert layout.a_input("encoder.layer.0.attention.self.query").startswith("lora_a.")
