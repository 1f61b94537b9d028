"""Assembly: the batch cap while queries wait follows the threads a process runs with."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from fleetserve.assembly import host_tier_bytes, interactive_tokens
from fleetserve.catalog import CostModel
from fleetserve.catalog.profiles import Choice
from fleetserve.catalog.spec import Profile
from fleetserve.settings import Settings

from .extras import needs


def choice(threads: int = 0) -> Choice:
    cost = CostModel(fixed_ms=1.0, per_token_ms=0.0, per_padded_token_ms=0.01)
    profile = Profile("cpu-x", max_batch_tokens=8192, cost=cost, threads=threads)
    return Choice(profile, "tuned", "tuned for cpu-x")


def test_the_cap_of_a_tuned_profile_comes_from_its_cost_model() -> None:
    # (25 - 1) / 0.01 = 2400 tokens in 25 ms, a multiple of 64 below: 2368
    assert choice().interactive_batch_tokens == 2368
    assert interactive_tokens(choice(), Settings.load(overrides={})) == 2368


def test_fewer_threads_than_tuned_with_shrink_the_cap() -> None:
    cores = os.cpu_count() or 1
    if cores < 2:
        pytest.skip("needs at least 2 CPU cores (fewer threads than tuned with)")
    half = Settings.load(overrides={"torch_threads": cores // 2})
    assert interactive_tokens(choice(), half) == 2368 * (cores // 2) // cores // 64 * 64
    # a profile tuned with those threads already predicts their speed: no change
    assert interactive_tokens(choice(threads=cores // 2), half) == 2368


def test_load_runtimes_name_the_profiles_and_the_gates_torch() -> None:
    """What the stack imports before any load: the profile's runtime (the spec's where
    the profile names none), and torch where a rule's precision is gated at load."""
    from fleetserve.assembly import load_runtimes
    from fleetserve.catalog import ModelSpec

    spec = ModelSpec(id="rt/m", family="dense", runtime="torch", sources=("/none",))
    ov = Profile("cpu-avx512bf16", precision="bf16", runtime="openvino")
    assert load_runtimes(spec, Choice(ov, "tuned", "")) == {"openvino"}
    assert load_runtimes(spec, Choice(ov, "rule", "")) == {"openvino", "torch"}
    fp32 = Profile("cpu-avx2", precision="fp32", runtime="")
    assert load_runtimes(spec, Choice(fp32, "rule", "")) == {"torch"}


@pytest.mark.parametrize(
    ("how", "adapters", "slots", "gate"),
    [
        ("tuned", "in_graph", 4, False),  # judged by the tune: not again at load
        ("tuned", "torch", 0, False),  # the slots failed the tune's gate: none made
        ("tuned", "", 4, True),  # tuned before the field: judged at load
        ("fallback", "torch", 4, True),  # another class's verdict is no evidence here
        ("rule", "", 4, True),
    ],
)
@needs("torch", "openvino", extra="openvino")
def test_a_tuned_profile_says_where_adapters_run(
    tmp_path: Path, how: str, adapters: str, slots: int, gate: bool
) -> None:
    """A profile tuned on this class carries the tune's verdict on the adapters' graph
    with LoRA slots (``adapters``); any other profile's slots are judged when made."""
    from fleetserve.assembly import build_catalog, build_runner
    from fleetserve.metrics import Metrics

    _, s = one_tiny_model(tmp_path, "tiny/ov")
    s = dataclasses.replace(s, max_adapters_per_batch=4)
    profile = Profile("cpu-x", precision="fp32", runtime="openvino", adapters=adapters)
    runner = build_runner(build_catalog(s).get("tiny/ov"), s, Metrics(), Choice(profile, how, ""))
    family = runner._factory()  # (made, not loaded)
    assert family.runtime.adapter_slots == slots
    assert (runner.adapters.slot_gate is not None) == gate


def one_tiny_model(tmp_path: Path, model_id: str) -> tuple[Path, Settings]:
    """A tiny BERT under ``model_id``, its catalog, and settings with a cache of its own."""
    from .conftest import NO_USER_PROFILES, TINY_CLASS
    from .tinymodels import build_bert, write_spec

    model = build_bert(tmp_path / "model")
    write_spec(tmp_path / "catalog", model_id, model)
    s = Settings.load(
        overrides={"catalog": str(tmp_path / "catalog"), "device": "cpu",
                   "hardware_class": TINY_CLASS, "profile_dir": NO_USER_PROFILES,
                   "cache_dir": str(tmp_path / "cache")}
    )  # fmt: skip
    return model, s


async def test_a_reload_measures_the_activation_peak_once_per_engine_and_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the profile has no memory figure, the peak of a full batch is measured at
    the first load only: a reload after an eviction ran a full batch (and a collection)
    again. It is kept on disk: the next process measures nothing either. New weights at
    the same path, or a torn file, are measured again."""
    from fleetserve import assembly
    from fleetserve.assembly import build_catalog, build_runner
    from fleetserve.metrics import Metrics

    model, s = one_tiny_model(tmp_path, "tiny/peak")
    calls: list[str] = []

    def measured(adapter: object, *args: object) -> int:
        calls.append(adapter.runtime.name)  # type: ignore[attr-defined]
        return 7 << 20

    monkeypatch.setattr(assembly, "measure_activation_peak", measured)
    runner = build_runner(build_catalog(s).get("tiny/peak"), s, Metrics())
    assert runner.profile.memory_bytes == 0  # a rule's profile: no tuner's figure
    for _ in range(3):  # loaded, evicted, loaded again
        assert (await runner.load()).peak == 7 << 20
        runner.unload()
    assert calls == ["torch"]
    (kept,) = (tmp_path / "cache" / "peak").glob("*.json")
    assert json.loads(kept.read_text())["bytes"] == 7 << 20
    again = build_runner(build_catalog(s).get("tiny/peak"), s, Metrics())  # the next process
    assert (await again.load()).peak == 7 << 20 and calls == ["torch"]
    again.unload()
    kept.write_text('{"key": "torn')
    assert (await build_runner(build_catalog(s).get("tiny/peak"), s, Metrics()).load()).peak
    assert calls == ["torch", "torch"] and json.loads(kept.read_text())["bytes"] == 7 << 20
    for f in model.glob("*.safetensors"):  # written again: a new mtime
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    await runner.load()
    assert calls == ["torch", "torch", "torch"]


async def test_what_a_load_held_is_the_next_processs_reserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights a load measured alone are kept on disk (``<cache_dir>/held``): the
    next process reserves them before its first load, not the files' size (an ONNX
    Runtime session holds 1.5 times its export), and a load beside others (its growth
    not its own) is charged them where the runtime counts less. New weights at the same
    path go back to the files."""
    from fleetserve.assembly import build_catalog, build_runner
    from fleetserve.fleet.drift import FLOOR
    from fleetserve.fleet.memory import weights_estimate
    from fleetserve.metrics import Metrics
    from fleetserve.worker import loadable
    from fleetserve.worker.load_watch import Cost

    model, s = one_tiny_model(tmp_path, "tiny/held")
    files = weights_estimate(model, "fp32")

    def runner() -> object:
        return build_runner(build_catalog(s).get("tiny/held"), s, Metrics())

    first = runner()
    assert first.expected().weights == files  # type: ignore[attr-defined]
    estimate = first._estimate  # type: ignore[attr-defined]
    held = (await first.load()).weights  # type: ignore[attr-defined]
    # a torch model holds what its files say, within the resident set's noise: none
    # kept. Two loaded CI runners measured this first load at 5.5 MB (files: 0.1 MB,
    # the floor 4 MiB), and kept it, as the rule says for a load past the floor
    kept = tmp_path / "cache" / "held"
    assert abs(held - files) <= 2 * FLOOR
    if abs(held - files) <= FLOOR:
        assert not kept.exists()
    else:  # (the noise's figure, kept: what follows starts from none)
        (noise,) = kept.glob("*.json")
        assert json.loads(noise.read_text())["bytes"] == held
        shutil.rmtree(kept)
    estimate.remember(3 * files + FLOOR)  # as an engine with its own copies measures
    (fact,) = (tmp_path / "cache" / "held").glob("*.json")
    assert json.loads(fact.read_text())["bytes"] == 3 * files + FLOOR
    assert runner().expected().weights == 3 * files + FLOOR  # type: ignore[attr-defined]

    class Beside(loadable.LoadWatch):  # another model loads at the same time
        def done(self) -> Cost:
            return dataclasses.replace(super().done(), own=False)

    monkeypatch.setattr(loadable, "LoadWatch", Beside)
    beside = runner()
    assert (await beside.load()).weights == 3 * files + FLOOR  # type: ignore[attr-defined]
    assert beside.memory["counted"] < 3 * files  # type: ignore[attr-defined]
    for f in model.glob("*.safetensors"):  # written again: a new mtime
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert runner().expected().weights == files  # type: ignore[attr-defined]
    shutil.rmtree(model)  # weights not (or no longer) on disk: nothing to reserve yet
    assert runner().expected().weights == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("100%", 1 << 30), ("400%", 4 << 30), ("512MiB", 512 << 20), ("0", 0), ("off", 0)],
)
def test_the_host_tier_is_a_size_or_a_percent_of_the_budget_above_100_too(
    text: str, expected: int
) -> None:
    assert host_tier_bytes(text, 1 << 30) == expected


@pytest.mark.parametrize("text", ["lots", "-5%", "x%", "inf%"])
def test_a_bad_host_tier_is_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match=r"^--host-tier: cannot use .*0/off$"):
        host_tier_bytes(text, 1 << 30)
