"""Mixed-adapter batches equal PEFT running each adapter alone (fp32, 1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fleetserve.lora.load import read_adapter
from fleetserve.lora.mixed import LoraBank, segments_of
from fleetserve.lora.shapes import match_modules
from tests.tiny_generate import build_llama
from tests.tiny_lora import LLAMA_TARGETS, load_base, make_lora, peft_model
from tests.tinymodels import build_bert


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert(tmp_path_factory.mktemp("lora") / "bert")


def batch(n: int, width: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 30, (n, width), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # padding in some rows
    mask[3, 3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_a_mixed_batch_equals_peft_alone_row_by_row(bert: Path, tmp_path: Path) -> None:
    adapters = {
        "t/a": make_lora(bert, tmp_path / "a", rank=4, seed=1),
        "t/b": make_lora(bert, tmp_path / "b", rank=8, seed=2, targets=("query", "key", "dense")),
        "t/c": make_lora(bert, tmp_path / "c", rank=2, seed=3, use_rslora=True),
    }
    model = load_base(bert)
    bank = LoraBank(model, match_modules, dtype=torch.float32)
    for key, path in adapters.items():
        tensors, scaling = read_adapter(path)
        bank.add(key, tensors, scaling)
    rows = [None, "t/a", "t/b", "t/a", None, "t/c"]
    inputs = batch(len(rows))
    with torch.inference_mode(), bank.plan(segments_of(rows), len(rows)):
        mixed = model(**inputs).last_hidden_state
    with torch.inference_mode():
        base = model(**inputs).last_hidden_state  # no plan: the base model itself
    for key, path in adapters.items():
        ref_model = peft_model(bert, path)
        with torch.inference_mode():
            ref = ref_model(**inputs).last_hidden_state
        for i, k in enumerate(rows):
            if k == key:
                torch.testing.assert_close(mixed[i], ref[i], atol=1e-5, rtol=0)
                assert not torch.allclose(mixed[i], base[i], atol=1e-3)  # it does something
    for i, k in enumerate(rows):
        if k is None:
            torch.testing.assert_close(mixed[i], base[i], atol=0, rtol=0)


def test_segments_are_slices_when_sorted_and_indices_otherwise() -> None:
    segs = dict(segments_of(["x", "x", None, "y", "x"]))
    assert isinstance(segs["x"], torch.Tensor) and segs["x"].tolist() == [0, 1, 4]
    assert segs["y"] == slice(3, 4)
    assert dict(segments_of([None, "a", "a"]))["a"] == slice(1, 3)


def test_removed_adapters_leave_the_base_unchanged(bert: Path, tmp_path: Path) -> None:
    model = load_base(bert)
    bank = LoraBank(model, match_modules, dtype=torch.float32)
    tensors, scaling = read_adapter(make_lora(bert, tmp_path / "a", seed=4))
    bank.add("t/a", tensors, scaling)
    inputs = batch(6)
    with torch.inference_mode():
        before = load_base(bert)(**inputs).last_hidden_state
        bank.remove("t/a")
        after = model(**inputs).last_hidden_state
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert "t/a" not in bank and bank.nbytes == 0


def test_a_decoder_mixes_adapters_across_rows(tmp_path: Path) -> None:
    llama = build_llama(tmp_path / "llama")
    paths = {
        k: make_lora(llama, tmp_path / k, targets=LLAMA_TARGETS, seed=i, head="causal_lm")
        for i, k in enumerate(["t/x", "t/y"])
    }
    model = load_base(llama, "causal_lm")
    bank = LoraBank(model, match_modules, dtype=torch.float32)
    for key, path in paths.items():
        bank.add(key, *read_adapter(path))
    rows = ["t/y", None, "t/x", "t/y"]
    inputs = batch(len(rows), seed=5)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    with torch.inference_mode(), bank.plan(segments_of(rows), len(rows)):
        mixed = model(**inputs).logits
    for key, path in paths.items():
        with torch.inference_mode():
            ref = peft_model(llama, path, "causal_lm")(**inputs).logits
        for i, k in enumerate(rows):
            if k == key:
                torch.testing.assert_close(mixed[i], ref[i], atol=1e-5, rtol=0)


def test_continuous_batching_mixes_adapters_across_running_sequences(tmp_path: Path) -> None:
    """Greedy decodes of sequences with different adapters, sharing every step, give
    the tokens each adapter's merged model gives alone."""
    from fleetserve.families.generate.engine import Engine, Seq
    from fleetserve.families.generate.sampling import TextStream
    from fleetserve.runtimes import SamplingParams
    from tests.tiny_generate import EOS_ID

    llama = build_llama(tmp_path / "llama", seed=3)
    paths = {
        k: make_lora(
            llama, tmp_path / k, targets=LLAMA_TARGETS, seed=7 + i, scale=0.3, head="causal_lm"
        )
        for i, k in enumerate(["t/x", "t/y"])
    }
    prompts = [[5, 9, 12, 40], [7, 7, 30], [50, 60, 70, 80, 90], [11, 3]]
    keys: list[str | None] = ["t/x", None, "t/y", "t/x"]
    params = SamplingParams(max_tokens=12, temperature=0.0)

    def run(model: object, bank: LoraBank | None, keys: list[str | None]) -> list[list[int]]:
        engine = Engine(model, eos_ids=[EOS_ID], vocab_size=300, bank=bank)
        seqs = [
            Seq(p, params, TextStream(lambda ids: " ".join(map(str, ids)), ()), adapter=k)
            for p, k in zip(prompts, keys, strict=True)
        ]
        for s in seqs[:2]:
            engine.add(s)
        engine.step()  # the others join while these two are running
        for s in seqs[2:]:
            engine.add(s)
        while not engine.idle:
            engine.step()
        return [s.out for s in seqs]

    model = load_base(llama, "causal_lm")
    bank = LoraBank(model, match_modules, dtype=torch.float32)
    for key, path in paths.items():
        bank.add(key, *read_adapter(path))
    mixed = run(model, bank, keys)
    alone = {None: run(load_base(llama, "causal_lm"), None, [None] * 4)}
    for key, path in paths.items():
        merged = peft_model(llama, path, "causal_lm").merge_and_unload()
        alone[key] = run(merged, None, [None] * 4)
    for i, key in enumerate(keys):
        assert mixed[i] == alone[key][i], (i, key)
    assert alone["t/x"] != alone[None]  # the adapters change what is generated
