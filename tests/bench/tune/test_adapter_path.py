"""The tune's gate of the adapter path (bench/tune/adapter_path.py): a winner on
OpenVINO gets a graph with LoRA slots, held to the slot gate against PEFT's arithmetic
at fp32; the verdict is the profile's ``adapters``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetserve.bench.tune import adapter_path
from fleetserve.bench.tune.candidates import Candidate
from fleetserve.bench.tune.options import ADAPTER_S
from fleetserve.bench.tune.search import Options, Search
from fleetserve.catalog import ModelSpec
from fleetserve.catalog.hardware import Hardware

from ...extras import needs
from ...tinymodels import build_bert

HW = Hardware("cpu", "x86_64", "Test CPU", 2, 8 * 2**30, frozenset({"avx2"}))


def tuned(path: Path, tmp: Path, runtime: str, family: str = "dense") -> Search:
    """A search whose winner is ``runtime`` at fp32, as the tune leaves it."""
    spec = ModelSpec.from_dict({"id": "tiny/bert", "family": family, "sources": [str(path)],
                                "pooling": "mean", "max_seq_len": 16})  # fmt: skip
    s = Search(spec, path, HW, "cpu-avx2", Options(cache_dir=tmp / "cache", budget_s=120))
    s.start()
    w = s._add(Candidate(runtime, "fp32", 2, 1, 1024, 16))
    w.samples, w.status = [100.0], "measured"
    s.winner = w
    return s


def test_the_final_reserve_holds_the_gate_once_a_likely_winner_runs_openvino() -> None:
    s = tuned(Path("/w"), Path("/tmp"), "torch")
    base = s.final_s()
    assert not adapter_path.applies(s)
    other = s._add(Candidate("openvino", "bf16", 2, 1, 1024, 16))
    other.samples, other.status = [95.0], "measured"  # within 10 % of the best
    assert s.final_s() == base + ADAPTER_S


async def test_a_runtime_without_slots_leaves_the_profile_unjudged() -> None:
    s = tuned(Path("/w"), Path("/tmp"), "torch")
    await adapter_path.judge(s)
    assert s.adapters == "" and s.adapter_quality is None


@pytest.mark.slow
@needs("torch", "openvino", extra="openvino")
async def test_slots_that_pass_make_the_profile_say_in_graph(tmp_path: Path) -> None:
    s = tuned(build_bert(tmp_path / "bert"), tmp_path, "openvino")
    await adapter_path.judge(s)
    q = s.adapter_quality
    assert s.adapters == "in_graph", s.notes
    assert q is not None and q["passed"] and q["metric"] == "min_cosine" and q["value"] > 0.9999


@pytest.mark.slow
@needs("torch", "openvino", extra="openvino")
async def test_slots_that_fail_make_the_profile_say_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slots that come out wrong (every delta tripled): the profile says torch, and the
    run's notes say why."""
    from fleetserve.runtimes.lora_slots import SlotStacks

    real_put = SlotStacks.put

    def put(self: SlotStacks, slot: int, weights: Any, scaling: float) -> None:
        real_put(self, slot, weights, 3 * scaling)

    monkeypatch.setattr(SlotStacks, "put", put)
    s = tuned(build_bert(tmp_path / "bert"), tmp_path, "openvino")
    await adapter_path.judge(s)
    assert s.adapters == "torch"
    assert s.adapter_quality is not None and not s.adapter_quality["passed"]
    assert any("failed the quality gate" in n for n in s.notes), s.notes


@pytest.mark.slow
@needs("torch", "openvino", extra="openvino")
async def test_a_graph_the_converter_cannot_make_makes_the_profile_say_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetserve.runtimes import openvino_lora

    def broken(*args: object) -> None:
        raise RuntimeError("the converter gave up")

    monkeypatch.setattr(openvino_lora, "ensure_slots", broken)
    s = tuned(build_bert(tmp_path / "bert"), tmp_path, "openvino")
    await adapter_path.judge(s)
    assert s.adapters == "torch" and s.adapter_quality is None
    assert any("the converter gave up" in n for n in s.notes), s.notes


async def test_with_no_time_left_the_profile_is_left_unjudged() -> None:
    s = tuned(Path("/w"), Path("/tmp"), "openvino")
    s.clock.t0 -= 10_000  # the budget is spent
    await adapter_path.judge(s)
    assert s.adapters == "" and any("not judged" in n for n in s.notes), s.notes


def test_the_report_says_where_adapters_run_and_the_gates_figure() -> None:
    from fleetserve.bench.tune.report import adapters_line

    q = {"metric": "min_cosine", "value": 0.9999991, "threshold": 0.9999, "passed": True}
    assert adapters_line({"runs": "in_graph", "quality": q}) == (
        "in the graph, with LoRA slots (min_cosine 0.999999 against PEFT at fp32 with a "
        "seeded adapter, needs 0.9999)"
    )
    assert adapters_line({"runs": "torch", "quality": None}) == (
        "on a torch copy (no graph with slots)"
    )
