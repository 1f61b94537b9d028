"""A base's Linear shapes from its safetensors headers; PEFT names matched to the base's."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from fleetserve.lora.shapes import is_embedding, linear_shapes, match_modules
from fleetserve.wire import InvalidInput

from .kit import Kit, kit_fixture  # noqa: F401

LAYERS = [f"encoder.layer.{i}.attention.self.{p}" for i in (0, 1) for p in ("query", "value")]


def test_linear_shapes_of_the_tiny_bert(kit: Kit) -> None:
    shapes = kit.shapes
    assert shapes["encoder.layer.0.attention.self.query"] == (32, 32)
    assert shapes["encoder.layer.1.intermediate.dense"] == (64, 32)  # (out, in)
    assert shapes["encoder.layer.1.output.dense"] == (32, 64)
    assert not any(is_embedding(m) for m in shapes)
    assert "embeddings.word_embeddings" not in shapes
    assert not any("LayerNorm" in m for m in shapes)  # 1-D weights are no Linear


def test_sharded_weights_are_read_from_every_shard(tmp_path: Path) -> None:
    save_file({"model.a.weight": np.zeros((4, 2), np.float32)}, tmp_path / "m-1.safetensors")
    save_file(
        {"model.b.weight": np.zeros((3, 5), np.float16), "model.b.bias": np.zeros(3, np.float16)},
        tmp_path / "m-2.safetensors",
    )
    assert linear_shapes(tmp_path) == {"model.a": (4, 2), "model.b": (3, 5)}


def test_a_base_without_safetensors_is_a_400(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(InvalidInput, match="not safetensors") as info:
        linear_shapes(tmp_path)
    assert info.value.field == "base"


def test_peft_names_match_with_or_without_a_prefix() -> None:
    peft = [f"base_model.model.{m}" for m in LAYERS]
    assert match_modules(peft, LAYERS) == dict(zip(peft, LAYERS, strict=True))
    prefixed = [f"bert.{m}" for m in LAYERS]
    assert match_modules(peft, prefixed) == dict(zip(peft, prefixed, strict=True))
    # the adapter was trained on a model with a head, the base has none
    headed = [f"base_model.model.bert.{m}" for m in LAYERS]
    assert match_modules(headed, LAYERS) == dict(zip(headed, LAYERS, strict=True))


def test_the_longest_suffix_wins_and_a_tie_is_ambiguous() -> None:
    base = ["encoder.layer.0.dense", "decoder.layer.0.dense", "layer.0.dense"]
    assert match_modules(["layer.0.dense"], base) == {"layer.0.dense": "layer.0.dense"}
    with pytest.raises(InvalidInput, match="ambiguous") as info:
        match_modules(["query"], LAYERS)
    assert "'query'" in info.value.message


def test_a_missing_module_is_named() -> None:
    with pytest.raises(InvalidInput, match=re.escape("'encoder.layer.7.attention.self.query'")):
        match_modules(["base_model.model.encoder.layer.7.attention.self.query"], LAYERS)
    with pytest.raises(InvalidInput, match="not a Linear layer"):
        match_modules(["layer.0.attention.self.quer"], LAYERS)


def test_two_names_for_one_layer_are_refused() -> None:
    with pytest.raises(InvalidInput, match="same base layer"):
        match_modules(["bert.encoder.layer.0.attention.self.query", LAYERS[0]], LAYERS)
