"""The quality gate at load for rule-chosen profiles, what /v1/models and the start log
say of every model's profile, and a profile whose runtime is not installed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from rich.console import Console

from fleetserve.assembly import build_catalog, build_profiles, log_choices
from fleetserve.bench.tune.gate import check, gate_at_load
from fleetserve.catalog import Catalog
from fleetserve.families import AnyFamily
from fleetserve.families.dense import DenseFamily
from fleetserve.runtimes import create_runtime

from ...conftest import ServerThread, tiny_settings
from ...tinymodels import build_bert, write_spec
from .conftest import MODEL


class Noisy(DenseFamily):
    """A candidate that loses too much precision: its rows move by a few percent."""

    def forward(self, items: Sequence[Any]) -> np.ndarray[Any, Any]:
        out = super().forward(items)
        rng = np.random.default_rng(len(items))
        return out + rng.normal(size=out.shape).astype(np.float32) * 0.2 * np.abs(out).mean()


def factory(catalog: Path, noisy: bool = False) -> Any:
    spec = Catalog.load([catalog]).get(MODEL)
    path = Path(spec.sources[0])

    def make(precision: str) -> AnyFamily:
        cls = Noisy if noisy and precision != "fp32" else DenseFamily
        return cls(spec, create_runtime("torch", device="cpu", precision=precision), path)

    return spec, make


def test_a_candidate_within_the_gate_is_kept(catalog: Path) -> None:
    spec, make = factory(catalog)
    fp16 = make("fp16")
    fp16.load()
    verify = gate_at_load(spec, "fp16", lambda: make("fp32"))
    assert verify(fp16) is fp16
    ref = make("fp32")
    ref.load()
    assert check(spec, fp16, ref).passed


def test_a_candidate_that_fails_the_gate_is_replaced_by_the_reference(
    catalog: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec, make = factory(catalog, noisy=True)
    bad = make("bf16")
    bad.load()
    ref = make("fp32")
    ref.load()
    q = check(spec, bad, ref)
    assert not q.passed and q.metric == "min_cosine" and q.value < 0.9999
    served = gate_at_load(spec, "bf16", lambda: make("fp32"))(bad)
    assert served is not bad and not isinstance(served, Noisy)
    assert served.runtime.precision == "fp32"
    assert "fails the quality gate" in caplog.text and "torch fp32 instead" in caplog.text


def test_models_say_which_profile_they_run_and_why(
    catalog: Path, caplog: pytest.LogCaptureFixture
) -> None:
    srv = ServerThread(tiny_settings(catalog, models=MODEL, hardware_class="cpu-amx")).start()
    try:
        data = {m["id"]: m for m in httpx.get(srv.url + "/v1/models").json()["data"]}
    finally:
        srv.stop()
    p = data[MODEL]["profile"]
    assert p["how"] == "rule" and p["hardware_class"] == "cpu-amx"
    assert "bf16 as tuned on cpu-amx" in p["reason"] and "fleetserve tune" in p["reason"]
    settings = tiny_settings(catalog, models=MODEL, hardware_class="cpu-amx")
    cat = build_catalog(settings)
    profiles = build_profiles(settings)
    with caplog.at_level(logging.INFO, logger="fleetserve.profiles"):
        log_choices({s.id: profiles.choose(s) for s in cat}, cat, Console())
    line = next(r.getMessage() for r in caplog.records if MODEL in r.getMessage())
    assert "bf16" in line and "rule:" in line


@pytest.mark.slow
def test_the_default_model_says_how_its_profile_was_found(real_server: ServerThread) -> None:
    data = {m["id"]: m for m in httpx.get(real_server.url + "/v1/models").json()["data"]}
    p = data["sentence-transformers/all-MiniLM-L6-v2"]["profile"]
    assert p["how"] in ("tuned", "fallback", "rule") and p["reason"]
    if p["how"] == "tuned":  # a bundled profile for this class: it names its file and date
        assert p["file"].endswith(".yaml") and p["tuned_on"]


def test_a_rule_profile_serves_within_the_gate(catalog: Path) -> None:
    """On an AMX class the rules pick bf16 (OpenVINO when installed); whatever survives
    the gate at load is within cosine 0.9999 of fp32 torch."""
    texts = ["the quick brown fox", "a small model", "queues and workers", "x"]
    _, make = factory(catalog)
    ref = make("fp32")
    ref.load()
    want = ref.forward(ref.tokenizer.encode(texts, truncate=True)[0])
    srv = ServerThread(tiny_settings(catalog, models=MODEL, hardware_class="cpu-amx")).start()
    try:
        r = httpx.post(srv.url + f"/v1/encode/{MODEL}", json={"inputs": texts, "normalize": False})
    finally:
        srv.stop()
    got = np.asarray(r.json()["embeddings"])
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999


BLOCKED = r"""
import asyncio, sys
sys.modules["openvino"] = None  # as if the openvino extra were not installed
import httpx
from rich.console import Console
from fleetserve.server import EmbeddedServer
from fleetserve.settings import Settings

async def main():
    s = Settings.load(overrides={"port": 0, "catalog": sys.argv[1], "device": "cpu",
                                 "models": "tiny/ok,tiny/ov", "hardware_class": "cpu-avx2",
                                 "profile_dir": "/dev/null/none", "tune": "off"})
    server = EmbeddedServer(s, console=Console(quiet=True))
    await server.start()
    try:
        async with httpx.AsyncClient(timeout=60) as c:
            for m in ("tiny/ov", "tiny/ok"):
                r = await c.post(f"http://127.0.0.1:{server.port}/v1/encode/{m}",
                                 json={"inputs": ["the quick fox"]})
                print(m, r.status_code, r.json().get("error", {}).get("message", "ok"))
            ready = await c.get(f"http://127.0.0.1:{server.port}/readyz")
            print("readyz", ready.status_code)
    finally:
        await server.stop()

asyncio.run(main())
"""


def test_a_profile_whose_runtime_is_not_installed_fails_that_model_alone(
    tmp_path: Path,
) -> None:
    model = build_bert(tmp_path / "model")
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/ok", model)
    write_spec(cat, "tiny/ov", model, profiles={"cpu": {"runtime": "openvino"}})
    r = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(cat)], capture_output=True, text=True, timeout=180
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert lines["tiny/ov"].startswith("503") and "fleetserve[openvino]" in lines["tiny/ov"]
    assert lines["tiny/ok"] == "200 ok"
    assert lines["readyz"] == "200"
    assert yaml.safe_load((cat / "tiny__ov.yaml").read_text())["profiles"]["cpu"]["runtime"]


async def test_the_runner_reports_what_the_gate_serves(catalog: Path) -> None:
    from fleetserve.catalog import Profile
    from fleetserve.metrics import Metrics
    from fleetserve.worker import ModelRunner

    spec, make = factory(catalog, noisy=True)
    runner = ModelRunner(
        spec,
        Profile("cpu-amx", precision="bf16", runtime="torch"),
        lambda: make("bf16"),
        Metrics(),
        verify=gate_at_load(spec, "bf16", lambda: make("fp32")),
    )
    await runner.load()
    assert (runner.profile.runtime, runner.profile.precision) == ("torch", "fp32")
    assert not isinstance(runner.family, Noisy)


def newer(path: Path) -> None:
    """The weights in ``path`` written again (their mtime moves on)."""
    for f in path.glob("*.safetensors"):
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))


@pytest.mark.parametrize("noisy", [False, True], ids=["passes", "fails"])
async def test_a_reload_of_weights_that_passed_compares_nothing_again(
    tmp_path: Path, noisy: bool
) -> None:
    """A verdict that passed holds for the same weights (their fingerprint): a reload
    after an eviction loads no reference. New weights, or a verdict that failed, are
    judged again."""
    from fleetserve.catalog import Profile
    from fleetserve.metrics import Metrics
    from fleetserve.runtimes.cache import weights_fingerprint
    from fleetserve.worker import ModelRunner

    path = build_bert(tmp_path / "model")
    write_spec(tmp_path / "catalog", MODEL, path, profiles={}, max_seq_len=64)
    spec, make = factory(tmp_path / "catalog", noisy=noisy)
    refs: list[AnyFamily] = []

    def reference() -> AnyFamily:
        refs.append(make("fp32"))
        return refs[-1]

    gate = gate_at_load(spec, "bf16", reference, lambda: weights_fingerprint(path))
    runner = ModelRunner(
        spec, Profile("cpu-amx", precision="bf16", runtime="torch"), lambda: make("bf16"),
        Metrics(), verify=gate,
    )  # fmt: skip
    for _ in range(3):  # loaded, then evicted and loaded again
        await runner.load()
        assert runner.profile.precision == ("fp32" if noisy else "bf16")
        runner.unload()
    assert len(refs) == (3 if noisy else 1)
    newer(path)
    await runner.load()  # new weights: judged again
    assert len(refs) == (4 if noisy else 2)
