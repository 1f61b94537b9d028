"""Adapters of a base served on OpenVINO or ONNX Runtime, end to end: with
``--lora-in-graph`` (the default) they run inside its graph, with LoRA slots, and no
torch copy is made; off, on a torch copy. Either way a batch mixes adapters and the
base, each row equal to PEFT running its adapter alone at fp32, and more adapters than
slots take turns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import TINY, ServerThread, tiny_settings
from tests.lora.test_serving import TEXTS, adapters, encode, mixed_batches_equal_peft
from tests.tinymodels import build_bert, write_spec

pytestmark = pytest.mark.slow
__all__ = ["adapters"]  # the fixture: three adapters uploaded to this module's server
SLOTS = 2  # fewer than the adapters: they take turns in the slots


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert(tmp_path_factory.mktemp("lora-ov") / "bert")


@pytest.fixture(
    scope="module",
    params=[("openvino", True), ("openvino", False), ("onnx", True)],
    ids=["openvino-in-graph", "openvino-torch-copy", "onnx-in-graph"],
)
def server(
    request: pytest.FixtureRequest, base_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    runtime, in_graph = request.param
    root = tmp_path_factory.mktemp(f"lora-{runtime}-server")
    srv = ov_server(base_dir, root, runtime, lora_in_graph=in_graph, max_adapters_per_batch=SLOTS)
    yield srv
    srv.stop()


def ov_server(
    base_dir: Path, root: Path, runtime: str = "openvino", **overrides: Any
) -> ServerThread:
    """A started server of the tiny BERT on ``runtime``, its stores under ``root``."""
    write_spec(root / "catalog", TINY, base_dir, runtime=runtime)
    settings = tiny_settings(root / "catalog", cache_dir=str(root / "cache"),
                             adapter_store=(root / "adapters").as_uri(), **overrides)  # fmt: skip
    return ServerThread(settings).start()


def model_info(srv: ServerThread) -> dict[str, Any]:
    r = httpx.get(f"{srv.url}/v1/models", timeout=10)
    (info,) = [m for m in r.json()["data"] if m["id"] == TINY]
    return dict(info)


def test_a_batch_mixes_adapters_and_the_base_each_row_as_peft_alone(
    server: ServerThread, adapters: dict[str, Path], base_dir: Path
) -> None:
    mixed_batches_equal_peft(server, adapters, base_dir)


def test_adapter_batches_run_where_the_setting_says_and_are_charged(
    server: ServerThread, adapters: dict[str, Path]
) -> None:
    encode(server.url, next(iter(adapters)), ["warm"])
    assert server.server is not None
    settings = server.server.settings
    runner: Any = server.server.runners[TINY]
    hosting = runner.adapters
    where = model_info(server)["adapters"]
    base_rt = runner.family.runtime
    tier = hosting._hosting[1]
    if settings.lora_in_graph:
        assert (where["runtime"], where["precision"]) == (base_rt.name, "fp32")
        assert hosting.host_family is runner.family  # no torch copy
        assert tier.copies[TINY] == base_rt.adapter_bytes() > 0
    else:
        assert where["runtime"] == "torch"
        assert hosting.host_family is not runner.family
        assert tier.copies[TINY] > 0


def test_the_slots_narrow_to_the_layers_the_adapters_use(base_dir: Path, tmp_path: Path) -> None:
    """An adapter on query and value alone: the graph made at start has slots on every
    layer fine-tuning targets; it narrows in the background, serving the while."""
    from tests.lora.test_serving import reference, upload
    from tests.tiny_lora import make_lora
    from tests.waiting import wait_for

    srv = ov_server(base_dir, tmp_path)
    try:
        path = make_lora(base_dir, tmp_path / "qv", seed=31, rank=4, targets=("query", "value"))
        key = upload(srv.url, path, "qv").json()["id"]
        assert srv.server is not None
        rt: Any = srv.server.runners[TINY].family.runtime
        wide = set(rt.lora_bank().model.layout.layers)
        first = encode(srv.url, key)
        wait_for(lambda: set(rt.lora_bank().model.layout.layers) < wide, 30, "narrower slots")
        np.testing.assert_allclose(encode(srv.url, key), first, atol=1e-5, rtol=0)
        np.testing.assert_allclose(first, reference(base_dir, path, TEXTS), atol=1e-5, rtol=0)
    finally:
        srv.stop()


def test_a_stopped_server_waits_for_the_fit_in_flight(
    base_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit's conversion runs on a thread nothing can cancel: the server's stop waits
    for it, so no conversion goes on behind a stopped server (one did in a test run,
    and its warning filters broke the next test's conversion)."""
    import threading

    from fleetserve.runtimes.openvino import OpenVinoRuntime
    from fleetserve.worker.lora_hosting import AdapterHosting
    from tests.lora.test_serving import upload
    from tests.tiny_lora import make_lora

    started, release, finished, settling = (threading.Event() for _ in range(4))

    def fit(self: OpenVinoRuntime) -> bool:
        started.set()
        release.wait(30)
        finished.set()
        return False

    real_settle = AdapterHosting.settle

    async def settle(self: AdapterHosting) -> None:
        settling.set()
        await real_settle(self)

    monkeypatch.setattr(OpenVinoRuntime, "fit_adapters", fit)
    monkeypatch.setattr(AdapterHosting, "settle", settle)
    srv = ov_server(base_dir, tmp_path)
    path = make_lora(base_dir, tmp_path / "qv", seed=32, rank=4, targets=("query", "value"))
    encode(srv.url, upload(srv.url, path, "qv").json()["id"])
    assert started.wait(30), "no fit started"
    seen: list[bool] = []
    stopper = threading.Thread(target=lambda: (srv.stop(), seen.append(finished.is_set())))
    stopper.start()
    assert settling.wait(30), "the stop did not wait for the adapter hosts"
    release.set()
    stopper.join(60)
    assert seen == [True]


def test_slots_that_fail_the_quality_gate_leave_adapters_to_a_torch_copy(
    base_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before adapters run in the graph, a seeded adapter on the calibration set runs on
    the slots and on the fp32 torch reference: slots that come out wrong (here, every
    delta tripled) fail it, and the adapters serve on a torch copy, still as PEFT."""
    from fleetserve.runtimes.lora_slots import SlotStacks
    from tests.lora.test_serving import reference, upload
    from tests.tiny_lora import make_lora

    real_put = SlotStacks.put

    def put(self: SlotStacks, slot: int, weights: Any, scaling: float) -> None:
        real_put(self, slot, weights, 3 * scaling)

    monkeypatch.setattr(SlotStacks, "put", put)
    srv = ov_server(base_dir, tmp_path)
    try:
        path = make_lora(base_dir, tmp_path / "qv", seed=33, rank=4, targets=("query", "value"))
        got = encode(srv.url, upload(srv.url, path, "qv").json()["id"])
        np.testing.assert_allclose(got, reference(base_dir, path, TEXTS), atol=1e-5, rtol=0)
        assert model_info(srv)["adapters"]["runtime"] == "torch"
    finally:
        srv.stop()
