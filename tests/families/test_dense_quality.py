"""Served embeddings equal sentence-transformers' in-process output, per shipped profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve import Client
from fleetserve.assembly import HF_CACHE
from fleetserve.catalog import Catalog
from fleetserve.catalog.profiles import bundled_dir, read_profile_file, slug
from fleetserve.catalog.sources import resolve
from fleetserve.families.dense import DenseFamily
from fleetserve.runtimes import create_runtime

from ..conftest import REAL, ServerThread

TEXTS = [
    "A man is eating food.",
    "fleetserve serves fleets of small open models on hardware you own",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 60,  # truncated at 256 tokens
    "Small models are now good enough for most tasks, given the right model per task.",
]


@pytest.fixture(scope="module")
def reference() -> np.ndarray[Any, Any]:
    st = pytest.importorskip("sentence_transformers")
    spec = Catalog.load().get(REAL)
    model = st.SentenceTransformer(str(resolve(REAL, spec.sources, HF_CACHE)), device="cpu")
    out: np.ndarray[Any, Any] = model.encode(TEXTS, normalize_embeddings=True)
    return out


def cosines(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(1))


@pytest.mark.slow
def test_served_cpu_profile_matches_sentence_transformers(
    real_server: ServerThread, reference: np.ndarray[Any, Any]
) -> None:
    with Client(real_server.url) as client:
        served = client.encode(REAL, TEXTS)
    assert served.shape == reference.shape
    assert cosines(served, reference).min() >= 0.9999


def shipped_profiles() -> list[Any]:
    """Every tuned profile the package ships for the default model, on any class."""
    files = sorted(bundled_dir().glob(f"*/{slug(REAL)}.yaml"))
    return [pytest.param(read_profile_file(f).profile, id=f.parent.name) for f in files]


@pytest.mark.slow
@pytest.mark.parametrize("profile", shipped_profiles())
def test_every_shipped_profile_keeps_quality(
    profile: Any, reference: np.ndarray[Any, Any], tmp_path: Path
) -> None:
    import torch

    device = "cuda" if profile.hardware.startswith("cuda") else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("the cuda profile needs a GPU; none on this machine")
    spec = Catalog.load().get(REAL)
    path = resolve(REAL, spec.sources, HF_CACHE)
    runtime = create_runtime(
        profile.runtime or spec.runtime,
        device=device,
        precision=profile.precision,
        cache_dir=tmp_path,
    )
    adapter = DenseFamily(spec, runtime, path)
    adapter.load()
    ids, _ = adapter.tokenizer.encode(TEXTS, truncate=True)
    got = adapter.forward(ids)
    assert cosines(got, reference).min() >= 0.9999


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cpu_autocast_precisions_keep_quality(
    precision: str, reference: np.ndarray[Any, Any]
) -> None:
    spec = Catalog.load().get(REAL)
    path = resolve(REAL, spec.sources, HF_CACHE)
    adapter = DenseFamily(spec, create_runtime("torch", device="cpu", precision=precision), path)
    adapter.load()
    ids, _ = adapter.tokenizer.encode(TEXTS, truncate=True)
    assert cosines(adapter.forward(ids), reference).min() >= 0.9999
