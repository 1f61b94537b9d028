"""The fleet in a real `fleetserve serve` process: a budget, eviction, models that fail."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fleetserve.fleet.memory import rss_of

from .. import forked
from ..cluster.conftest import free_port
from ..conftest import NO_USER_PROFILES, TINY_CLASS
from ..tinymodels import build_bert, write_spec

pytestmark = pytest.mark.services  # each test serves from a `fleetserve serve` process

MIB = 1 << 20
SHAPES = [(256, 2), (384, 4), (512, 4)]  # hidden, layers: about 4, 19 and 33 MiB of weights


class Served:
    """``python -m fleetserve serve`` (forked: tests/forked.py) on a free port, its output
    collected."""

    def __init__(self, catalog: Path, home: Path, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "fleetserve", "serve", "--port", str(self.port)]
        cmd += ["--catalog", str(catalog), "--device", "cpu", "--torch-threads", "1"]
        cmd += ["--profile-dir", NO_USER_PROFILES, "--hardware-class", TINY_CLASS, *args]
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
        self.proc = forked.popen(
            cmd, env={**base, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def wait_ready(self, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError("server exited:\n" + "\n".join(self.lines))
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("not ready:\n" + "\n".join(self.lines))

    def models(self) -> dict[str, dict[str, Any]]:
        data = httpx.get(self.url + "/v1/models", timeout=5).json()["data"]
        return {m["id"]: m for m in data}

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        want = [f'{k}="{v}"' for k, v in labels.items()]
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and all(w in line for w in want)
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.close()

    def close(self) -> None:
        self._reader.join(5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def embed(url: str, model: str, text: str, **headers: str) -> httpx.Response:
    body = {"model": model, "input": [text]}
    return httpx.post(url + "/v1/embeddings", json=body, headers=headers, timeout=60)


def vector(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)


# -- twelve models, three times the budget, a Zipf trace ---------------------------
@pytest.fixture(scope="module")
def fleet_catalog(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("fleet")
    cat = root / "catalog"
    total = 0
    for i in range(12):
        hidden, layers = SHAPES[i % 3]
        path = build_bert(root / f"m{i}", seed=i, hidden=hidden, layers=layers)
        total += sum(f.stat().st_size for f in path.glob("*.safetensors"))
        write_spec(cat, f"fleet/m{i}", path, dimensions=hidden, pinned=i == 0)
    return cat, total


@pytest.fixture(scope="module")
def fleet_server(
    fleet_catalog: tuple[Path, int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Served, int]]:
    cat, total = fleet_catalog
    budget = total // 3
    home = tmp_path_factory.mktemp("home")
    srv = Served(cat, home, "--memory-budget", str(budget), "--models", "fleet/*")
    srv.wait_ready()
    yield srv, budget
    srv.stop()


def test_a_zipf_trace_over_three_times_the_budget_stays_within_it(
    fleet_server: tuple[Served, int],
) -> None:
    srv, budget = fleet_server
    ids = [f"fleet/m{i}" for i in range(12)]
    ready_rss = rss_of(srv.proc.pid)
    pinned = srv.models()["fleet/m0"]
    assert pinned["state"] == "resident" and pinned["pinned"] is True
    reference = {}
    for m in ids:  # once each, one at a time: what every later answer must equal
        reference[m] = vector(embed(srv.url, m, "the fleet shares one budget"))
    rng = random.Random(3)
    weights = [1 / (i + 1) ** 1.1 for i in range(12)]
    trace = rng.choices(ids, weights, k=150)
    peak = [rss_of(srv.proc.pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(rss_of(srv.proc.pid))
            states = {m: d["state"] for m, d in srv.models().items()}
            assert states["fleet/m0"] == "resident"
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(lambda m: (m, embed(srv.url, m, "the fleet shares one budget")), trace)
        )
    done.set()
    sampler.join(5)
    for m, r in answers:  # every request answered, and right, across evictions
        np.testing.assert_allclose(vector(r), reference[m], atol=1e-5)
    models = srv.models()
    assert srv.metric("fleetserve_model_evictions_total", reason="pressure") > 0
    # measured memory, not only the bookkeeping: the resident set grew by at most the
    # budget beyond what the pinned model held at start (plus allocator slack)
    grown = max(peak) - ready_rss
    assert grown <= budget - pinned["bytes"] + budget // 4, (grown / MIB, budget / MIB)
    assert models["fleet/m0"]["state"] == "resident"
    assert srv.metric("fleetserve_resident_bytes") <= budget


def test_a_model_kept_alive_by_a_request_is_not_evicted(fleet_server: tuple[Served, int]) -> None:
    srv, budget = fleet_server
    vector(embed(srv.url, "fleet/m11", "stay", **{"X-Keep-Alive": "10m"}))  # the largest
    evicted = srv.metric("fleetserve_model_evictions_total", reason="pressure")
    served = 0
    for i in (1, 4, 7, 10, 3, 6, 9):  # more than the rest of the budget holds
        r = embed(srv.url, f"fleet/m{i}", "push")
        if r.status_code == 503:  # a 19 MiB model's load holds ~40 MiB for a moment
            message = r.json()["error"]["message"]
            assert "no room" in message and "fleet/m11" in message, message
            continue
        vector(r)
        served += 1
    assert served >= 3  # the small ones at least, evicting each other
    assert srv.metric("fleetserve_model_evictions_total", reason="pressure") > evicted
    assert srv.models()["fleet/m11"]["state"] == "resident"
    refused = 0
    for m in ("fleet/m8", "fleet/m5", "fleet/m2"):  # as large: at most one fits beside it
        r = embed(srv.url, m, "stay too", **{"X-Keep-Alive": "10m"})
        if r.status_code == 503:
            refused += 1
            message = r.json()["error"]["message"]
            assert r.headers["retry-after"] and "no room" in message, message
            assert "fleet/m11" in message and "kept alive" in message, message
        else:
            vector(r)
    assert refused >= 2 - (budget > 4 * srv.models()["fleet/m11"]["bytes"])
    assert srv.models()["fleet/m11"]["state"] == "resident"


@pytest.mark.parametrize(
    ("value", "says"),
    [("-5s", "negative"), ("48h", "enormous"), ("soon", "duration"), ("nan", "finite")],
)
def test_a_bad_keep_alive_is_a_400_naming_the_field(
    fleet_server: tuple[Served, int], value: str, says: str
) -> None:
    srv, _ = fleet_server
    r = embed(srv.url, "fleet/m0", "x", **{"X-Keep-Alive": value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["field"] == "keep_alive" and says in err["message"], err


# -- models that cannot load fail alone ---------------------------------------------
@pytest.fixture(scope="module")
def broken_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("broken")
    cat = root / "catalog"
    good = build_bert(root / "good")
    write_spec(cat, "ok/dense", good, pinned=True)
    write_spec(cat, "broken/image", good, family="image")  # its extra (Pillow) is absent
    write_spec(cat, "broken/absent", root / "never-installed")
    corrupt = root / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{not json")
    write_spec(cat, "broken/corrupt", corrupt)
    shadow = root / "shadow"  # a Pillow that cannot be imported: the extra "missing"
    (shadow / "PIL").mkdir(parents=True)
    (shadow / "PIL" / "__init__.py").write_text("raise ImportError('No module named PIL')\n")
    srv = Served(
        cat,
        root / "home",
        *("--load-retry-after", "600", "--models", "ok/*,broken/*"),
        env={"PYTHONPATH": str(shadow)},
    )
    srv.wait_ready()
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    ("model", "status", "says"),
    [
        ("broken/image", 503, "pip install 'fleetserve[image]'"),
        ("broken/absent", 404, "never-installed"),
        ("broken/corrupt", 503, "failed to load"),
    ],
)
def test_a_model_that_cannot_load_fails_alone_with_its_reason(
    broken_server: Served, model: str, status: int, says: str
) -> None:
    srv = broken_server
    body = {"inputs": ["x"]}
    answers = [httpx.post(f"{srv.url}/v1/encode/{model}", json=body, timeout=60) for _ in "abc"]
    for r in answers:
        assert r.status_code == status, r.text
        assert says in r.json()["error"]["message"]
    assert len({r.json()["error"]["message"] for r in answers}) == 1  # the same each time
    assert srv.metric("fleetserve_model_loads_total", model=model, outcome="failed") == 1
    assert srv.models()[model]["state"] == "failed"
    assert httpx.get(srv.url + "/readyz").status_code == 200
    assert httpx.get(srv.url + "/healthz").status_code == 200
    vector(embed(srv.url, "ok/dense", "the others keep serving"))


def test_a_budget_below_the_pinned_models_fails_start_in_one_line(tmp_path: Path) -> None:
    cat = tmp_path / "catalog"
    write_spec(cat, "p/one", build_bert(tmp_path / "m", hidden=128), pinned=True)
    srv = Served(cat, tmp_path / "home", "--memory-budget", "64KiB", "--models", "p/*")
    assert srv.proc.wait(60) != 0
    srv.close()
    errors = [line for line in srv.lines if "error" in line.lower()]
    assert len(errors) == 1, srv.lines
    assert "--memory-budget 0.1 MiB is below the pinned models' total" in errors[0]
    assert "p/one" in errors[0] and "Traceback" not in "\n".join(srv.lines)
