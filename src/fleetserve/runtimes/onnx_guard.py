"""The int8 guard's pieces, shared by the ONNX runtime and its export: the session
both open, the calibration set, its feeds and the cosine comparison of two graphs.
Apart from `onnx.py` so that `onnx_export.py`, which `onnx.py` calls, need not import it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

try:
    import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the ONNX runtime needs onnxruntime and onnx: pip install 'fleetserve[onnx]'"
    ) from exc

from ..wire.values import Array
from .base import Head
from .calibration import CALIBRATION
from .engines import OrtSession, Provider

DEFAULT_MIN_COSINE = 0.999
Feed = dict[str, Array]


def session(
    file: Path, providers: Sequence[Provider] = ("CPUExecutionProvider",), threads: int = 0
) -> OrtSession:
    """An ONNX Runtime session with all graph optimizations on."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if threads > 0:
        opts.intra_op_num_threads = threads
    sess: OrtSession = ort.InferenceSession(str(file), opts, providers=list(providers))
    return sess


# -- the int8 guard's calibration set and comparison ---------------------------------------
def calibration_feeds(path: Path, head: Head, inputs: set[str]) -> list[Feed]:
    """The calibration set in padded batches of 8, tokenized with the model's
    tokenizer.json (sentence pairs for sequence classification); seeded random ids
    when the model has no tokenizer.json."""
    texts = list(CALIBRATION)
    file = path / "tokenizer.json"
    if file.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(file))
        tok.no_padding()
        tok.enable_truncation(max_length=min(128, _max_positions(path)))
        if head is Head.SEQUENCE_CLASSIFICATION:
            pairs = [(t, texts[(i + 1) % len(texts)]) for i, t in enumerate(texts)]
            encs = tok.encode_batch(pairs)
        else:
            encs = tok.encode_batch(texts)
        rows = [(e.ids, e.type_ids) for e in encs]
    else:
        rng = np.random.default_rng(0)
        vocab = int(json.loads((path / "config.json").read_text()).get("vocab_size", 1000))
        sizes = [8 + i % 24 for i in range(len(texts))]
        rows = [(list(rng.integers(min(5, vocab - 1), vocab, n)), [0] * n) for n in sizes]
    feeds = []
    for k in range(0, len(rows), 8):
        chunk = rows[k : k + 8]
        width = max(len(ids) for ids, _ in chunk)
        feed: Feed = {
            n: np.zeros((len(chunk), width), np.int64)
            for n in ("input_ids", "attention_mask", "token_type_ids")
        }
        for i, (ids, types) in enumerate(chunk):
            feed["input_ids"][i, : len(ids)] = ids
            feed["attention_mask"][i, : len(ids)] = 1
            feed["token_type_ids"][i, : len(ids)] = types
        feeds.append({n: a for n, a in feed.items() if n in inputs})
    return feeds


def compare(fp32: OrtSession, int8: OrtSession, feeds: list[Feed]) -> dict[str, list[float]]:
    """Cosines between the two graphs' outputs: per item (real tokens only for per-token
    outputs); narrow outputs (classifier logits) as one vector over all items, centred
    on the fp32 mean so that a shared offset cannot hide a change in ranking. Keyed by
    output name."""
    names = [o.name for o in fp32.get_outputs()]
    got: dict[str, tuple[list[Array], list[Array]]] = {n: ([], []) for n in names}
    for feed in feeds:
        mask = feed["attention_mask"].astype(bool)
        for n, a, b in zip(names, fp32.run(names, feed), int8.run(names, feed), strict=True):
            for i in range(len(a)):
                keep = mask[i] if a.ndim == 3 else slice(None)
                got[n][0].append(a[i][keep])
                got[n][1].append(b[i][keep])
    out: dict[str, list[float]] = {}
    for n, (a_items, b_items) in got.items():
        if a_items[0].size < 16:
            a, b = np.stack(a_items), np.stack(b_items)
            mu = a.mean(0)
            out[n] = [_cosine(a - mu, b - mu)]
        else:
            out[n] = [_cosine(x, y) for x, y in zip(a_items, b_items, strict=True)]
    return out


def _cosine(a: Array, b: Array) -> float:
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx < 1e-12 or ny < 1e-12:
        return 1.0 if max(nx, ny) < 1e-12 else 0.0
    return float(x @ y) / (nx * ny)


def _max_positions(path: Path) -> int:
    cfg = json.loads((path / "config.json").read_text())
    return int(cfg.get("max_position_embeddings", 512)) - 2
