"""tune.activation: the activation peak of one full batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fleetserve.bench.tune.activation import measure_activation_peak

from ...tiny_generate import build_llama, load_adapter
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
    # a generation spec over an adapter that does not generate, a broken one: 0
    generate = dataclasses.replace(spec, family="generate")
    assert measure_activation_peak(adapter, generate, model, 256, 8) == 0
    assert measure_activation_peak(object(), spec, model, 256, 8) == 0  # type: ignore[arg-type]


def test_a_generation_models_peak_covers_its_largest_prefill(tmp_path: Path) -> None:
    """A generation model's batch is its engine's largest prefill (here 8 prompts of one
    512-token chunk): what is charged covers what such a prefill takes above the
    weights and the KV cache it leaves (which the fleet charges apart), and fewer rows
    within the budget are charged less. Hidden 256: at 32 a prompt's prefill took about
    1 MiB, within the resident set's noise, and a loaded CI runner measured 0.46 of it."""
    from fleetserve.bench.tune.activation import _peak_of
    from fleetserve.families.generate.chat import GenItem
    from fleetserve.runtimes import SamplingParams

    path = build_llama(tmp_path / "llama", max_positions=1024, hidden=256)
    gen = load_adapter(path, max_seq_len=1024)
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    rows = [GenItem([(7 * i + 31 * j) % 259 for j in range(512)], greedy) for i in range(8)]
    gen.forward(rows)  # the first large prefill grows the heap once, as a server's does
    actual = _peak_of("cpu", lambda: gen.forward(rows)) - gen.kv_cache_bytes(8 * 512)
    charged = measure_activation_peak(gen, gen.spec, path, 8 * 513, 8)
    assert actual > 1 << 20  # the prefill is not lost in the resident set's noise
    assert charged >= 0.6 * actual, (charged, actual)
    assert measure_activation_peak(gen, gen.spec, path, 2 * 513, 8) < charged
    assert measure_activation_peak(gen, gen.spec, path, 8 * 513, 2) < charged  # batch size


async def test_the_tune_measures_the_winners_peak_before_traffic_and_keeps_the_larger(
    tmp_path: Path,
) -> None:
    """The tune's winner: its peak at the full budget is measured as its stack loads,
    before the knee's batches grow the process, and the profile's figure is the larger
    of that and what the cost fit's batches grew it by."""
    from fleetserve.bench.tune import steps
    from fleetserve.bench.tune.workload import requests

    from .test_adapter_path import tuned

    s = tuned(build_bert(tmp_path / "bert", max_positions=512), tmp_path, "torch")
    s.requests = requests(s.spec, s.path, "mix", 8)  # (as the tune's run sets them)
    s.clock.t0 -= 10_000  # no budget left: the cost fit runs its least (3 s)
    w = s.winner
    assert w is not None
    async with s._stack(w.cand) as stack:
        await steps.activation_peak(s, stack)
        assert s.activation > 0
        s.activation = 1 << 30  # larger than any batch of this model takes
        await steps.cost_and_memory(s, stack)
    assert s.memory is not None and s.memory["activation_peak_bytes"] == 1 << 30
