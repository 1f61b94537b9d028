"""Adapters served inside a runtime's own graph, on OpenVINO and on ONNX Runtime
(runtimes/graph_slots.py, slot_bank.py and each engine's converter): a batch's rows with
different adapters, or none, against PEFT running each adapter alone at fp32; more
adapters than slots; a layout widened for an adapter's layers, and narrowed to the hot
adapters'; what cannot be slotted is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.lora.load import read_adapter
from fleetserve.runtimes import Head, Output
from fleetserve.wire import InvalidInput

from ..extras import needs
from ..tiny_lora import make_lora, peft_mean, token_feed
from ..tinymodels import build_bert

pytestmark = [pytest.mark.slow, pytest.mark.soaks, needs("torch", "peft", extra="train")]

TEXTS = ["the quick brown fox", "hello world", "lazy dog sleeps", "river bank money"]
PAIRS = ["a dog", "the bank of the river", "money", "sleeps"]  # a cross-encoder's documents


KINDS = {"openvino": needs("openvino", extra="openvino"), "onnx": needs("onnx", extra="onnx")}


@pytest.fixture(scope="module", params=[pytest.param(k, marks=m) for k, m in KINDS.items()])
def kind(request: pytest.FixtureRequest) -> str:
    """The runtime whose graph takes the slots."""
    return str(request.param)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, kind: str) -> Path:
    """One cache per runtime: each graph is converted once, as a server's would be."""
    return tmp_path_factory.mktemp(f"{kind}-slots-cache")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("ov-slots")
    base = build_bert(root / "bert")
    adapters = {  # ranks 2, 4 and 8; the first on fewer layers
        "a": make_lora(base, root / "a", seed=1, rank=2, targets=("query", "value")),
        "b": make_lora(base, root / "b", seed=2, rank=4, alpha=8.0),
        "c": make_lora(base, root / "c", seed=3, rank=8, targets=("query", "key", "dense")),
    }
    return base, adapters


def runtime(base: Path, cache: Path, slots: int, head: Head = Head.BASE) -> Any:
    """``base`` loaded on the runtime ``cache`` is for, with ``slots`` LoRA slots."""
    from fleetserve.runtimes import create_runtime

    kind = cache.name.partition("-slots-cache")[0]
    rt = create_runtime(kind, device="cpu", precision="fp32", cache_dir=cache,
                        adapter_slots=slots, max_rank=8)  # fmt: skip
    rt.load(base, head)
    return rt


def add(rt: Any, key: str, adapter: Path) -> None:
    tensors, scaling = read_adapter(adapter)
    rt.lora_bank().add(key, tensors, scaling)


def run(rt: Any, base: Path, keys: list[str | None]) -> np.ndarray[Any, Any]:
    """TEXTS through ``rt``, row ``i`` with adapter ``keys[i]``, as the worker runs it."""
    from fleetserve.lora.mixed import segments_of

    f = token_feed(base, TEXTS)
    ids, mask, types = f["input_ids"], f["attention_mask"], f["token_type_ids"]
    if not any(keys):
        out: np.ndarray[Any, Any] = rt.run(ids, mask, Output.MEAN, types)
        return out
    with rt.lora_bank().plan(segments_of(keys), len(keys)):
        out = rt.run(ids, mask, Output.MEAN, types)
    return out


def want(base: Path, adapters: dict[str, Path], keys: list[str | None]) -> np.ndarray[Any, Any]:
    refs = {k: peft_mean(base, adapters[k] if k else None, TEXTS) for k in set(keys)}
    return np.stack([refs[k][i] for i, k in enumerate(keys)])


def test_each_row_runs_its_adapter_as_peft_does_in_parts_past_the_slots(
    cache: Path, made: tuple[Path, dict[str, Path]]
) -> None:
    """Three adapters of ranks 2, 4 and 8 in a graph with two slots: the batch runs in
    two parts of contiguous rows, each row as PEFT runs its adapter alone."""
    base, adapters = made
    rt = runtime(base, cache, slots=2)
    assert rt.in_graph and not rt.takes_adapters
    rt.prepare_adapters()
    assert rt.takes_adapters and rt.adapter_bytes() > 0
    empty = rt.adapter_bytes()
    for key, path in adapters.items():
        add(rt, key, path)
    layers = rt.lora_bank().model.layout.layers  # the stacks may grow to 3 slots of rank 8
    assert rt.lora_bank().stack_bytes() == 3 * 8 * sum(i + o for o, i in layers.values()) * 4
    assert rt.adapter_bytes() > empty  # charged as the stacks may grow
    keys: list[str | None] = ["a", None, "b", "c"]
    np.testing.assert_allclose(run(rt, base, keys), want(base, adapters, keys), atol=1e-5)
    assert np.abs(run(rt, base, ["c"] * 4) - want(base, adapters, [None] * 4)).max() > 1e-3


def test_slots_are_reused_least_recently_used_first_with_nothing_compiled_again(
    cache: Path, made: tuple[Path, dict[str, Path]]
) -> None:
    base, adapters = made
    rt = runtime(base, cache, slots=1)
    rt.prepare_adapters()
    compiled = rt.lora_bank().model
    for key, path in adapters.items():
        add(rt, key, path)
    for keys in (["a"] * 4, ["b", "b", None, None], ["a", None, "a", None], ["c"] * 4):
        np.testing.assert_allclose(run(rt, base, keys), want(base, adapters, keys), atol=1e-5)
    assert rt.lora_bank().model is compiled
    assert rt.lora_bank().keys()[-1] == "c"  # least recently used first


def test_base_only_batches_stay_on_the_served_graph(
    cache: Path, made: tuple[Path, dict[str, Path]]
) -> None:
    base, adapters = made
    rt = runtime(base, cache, slots=2)
    rt.prepare_adapters()
    add(rt, "b", adapters["b"])
    bank = rt.lora_bank()
    bank.run = None  # a base-only batch never reaches the slots
    np.testing.assert_allclose(run(rt, base, [None] * 4), want(base, adapters, [None] * 4),
                               atol=1e-5)  # fmt: skip


def test_an_adapter_on_other_layers_gets_a_wider_layout(
    cache: Path, made: tuple[Path, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slots start on the layers fine-tuning targets; an adapter on another Linear layer
    converts a wider graph once, taken up at the next batch."""
    from fleetserve.runtimes import lora_slots

    base, adapters = made
    monkeypatch.setattr(lora_slots, "TRAINED", ("query",))
    rt = runtime(base, cache, slots=2)
    rt.prepare_adapters()
    first = rt.lora_bank().model
    tensors, _ = read_adapter(adapters["b"])
    assert not rt.covers(list(tensors))
    rt.prepare_adapters(list(tensors))
    assert rt.covers(list(tensors)) and rt.lora_bank().model is not first
    add(rt, "b", adapters["b"])
    keys: list[str | None] = ["b", None, "b", None]
    np.testing.assert_allclose(run(rt, base, keys), want(base, adapters, keys), atol=1e-5)


def test_what_cannot_be_slotted_is_refused_by_name(
    cache: Path, made: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    base, adapters = made
    rt = runtime(base, cache, slots=2)
    rt.prepare_adapters()
    with pytest.raises(InvalidInput, match="word_embeddings is not a Linear layer") as err:
        rt.prepare_adapters(["embeddings.word_embeddings"])
    assert err.value.field == "target_modules" and rt.in_graph  # the slots go on
    big = make_lora(base, tmp_path / "big", rank=16, targets=("query",))
    with pytest.raises(InvalidInput, match="rank 16 is above the slot layout's 8") as err:
        add(rt, "big", big)
    assert err.value.field == "rank" and "big" not in rt.lora_bank()
    add(rt, "a", adapters["a"])
    rt.lora_bank().remove("a")
    with pytest.raises(KeyError, match="not hot"):
        run(rt, base, ["a"] * 4)


def test_the_first_slots_are_on_what_fine_tuning_targets() -> None:
    from fleetserve.lora.train.trainer import BERT_TARGETS
    from fleetserve.runtimes.lora_slots import TRAINED

    assert TRAINED == BERT_TARGETS


# each family that takes adapters, by the head and output its forward runs
FAMILY_HEADS = {
    "multivector": (Head.BASE, Output.HIDDEN),
    "sparse": (Head.MASKED_LM, Output.SPLADE),
    "cross_encoder": (Head.SEQUENCE_CLASSIFICATION, Output.LOGITS),
    "ner": (Head.TOKEN_CLASSIFICATION, Output.LOGITS),
}


@pytest.mark.parametrize("family", list(FAMILY_HEADS))
def test_each_family_head_runs_its_rows_adapters_as_peft_does(
    family: str, cache: Path, tmp_path: Path
) -> None:
    """The slots go into the whole head's graph: SPLADE's vocabulary transform, a
    classifier's pooler, a token classifier (dense, by MEAN, above)."""
    from fleetserve.lora.mixed import segments_of

    from ..tiny_lora import peft_model
    from ..tiny_onnx import batch, build_head, head_output, model_class

    head, output = FAMILY_HEADS[family]
    base = build_head(tmp_path / "base", head, seed=5)
    targets = ("query", "key", "value", "dense")
    lora = {k: make_lora(base, tmp_path / k, seed=s, rank=r, head=head.value, targets=targets)
            for k, s, r in (("x", 7, 2), ("y", 8, 4))}  # fmt: skip
    x = batch(base, TEXTS, PAIRS if head is Head.SEQUENCE_CLASSIFICATION else None)
    rt = runtime(base, cache, slots=2, head=head)
    rt.prepare_adapters()
    for key, path in lora.items():
        add(rt, key, path)

    keys: list[str | None] = ["x", None, "y", "x"]
    with rt.lora_bank().plan(segments_of(keys), len(keys)):
        got = rt.run(x["ids"], x["mask"], output, token_type_ids=x["types"])
    refs = {k: head_output(peft_model(base, lora[k], head.value), head, output, x) for k in lora}
    refs[None] = head_output(model_class(head).from_pretrained(str(base)).eval(), head, output, x)
    want = np.stack([refs[k][i] for i, k in enumerate(keys)])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(refs["x"] - refs[None]).max() > 1e-3  # the adapter matters


def test_slots_fit_to_the_layers_the_hot_adapters_use(
    cache: Path, made: tuple[Path, dict[str, Path]]
) -> None:
    """Each slot costs time on every adapter batch: the graph narrows to the layers the
    hot adapters use, widens again for one that needs more, and a narrower graph made
    while an adapter on another layer came is not taken up."""
    base, adapters = made
    rt = runtime(base, cache, slots=2)
    rt.prepare_adapters()
    wide = set(rt.lora_bank().model.layout.layers)
    add(rt, "a", adapters["a"])  # query and value only
    assert rt.fit_adapters()
    narrow = set(rt.lora_bank().model.layout.layers)
    assert narrow < wide and all(n.endswith(("query", "value")) for n in narrow)
    assert not rt.fit_adapters()  # fit already
    keys: list[str | None] = ["a", None, "a", None]
    np.testing.assert_allclose(run(rt, base, keys), want(base, adapters, keys), atol=1e-5)
    tensors, _ = read_adapter(adapters["c"])  # query, key and dense: wider again
    rt.prepare_adapters(list(tensors))
    add(rt, "c", adapters["c"])
    keys = ["a", "c", None, "c"]
    np.testing.assert_allclose(run(rt, base, keys), want(base, adapters, keys), atol=1e-5)
    stale, _ = rt._slot_model(sorted(narrow), ())  # made for "a" alone, before "c" came
    assert not rt.lora_bank().swap(stale)
    np.testing.assert_allclose(run(rt, base, keys), want(base, adapters, keys), atol=1e-5)


@needs("onnx", extra="onnx")
def test_an_int8_onnx_graph_takes_no_slots(
    made: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    """Rows with adapters would run at fp32 beside int8 ones: its adapters go to a torch
    copy (any guard passes here: the point is the precision that runs)."""
    from fleetserve.runtimes.onnx import OnnxRuntime

    base, _ = made
    rt = OnnxRuntime(device="cpu", precision="int8", cache_dir=tmp_path, min_cosine=0.0,
                     adapter_slots=2)  # fmt: skip
    rt.load(base)
    assert rt.precision == "int8" and not rt.in_graph
