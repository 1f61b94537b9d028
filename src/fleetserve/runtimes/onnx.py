"""The ONNX Runtime runtime: small install, fast cold start, fp32 or guarded int8.

``load`` finds (or makes, see ``onnx_export``) the cached graph of the checkpoint's
head, which carries every output of that head with pooling and SPLADE baked in, and
opens one session on it. int8 is used only when the cached guard passed; otherwise
the runtime runs fp32 and logs why. Call ``run`` from one thread: ONNX Runtime
releases the GIL during the forward pass.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

try:
    import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the ONNX runtime needs onnxruntime and onnx: pip install 'fleetserve[onnx]'"
    ) from exc
from rich.console import Console

from ..wire.values import Array
from . import DEFAULT_CACHE
from .base import Head, Output
from .engines import OrtSession, Provider

if TYPE_CHECKING:
    from .onnx_export import Export

log = logging.getLogger("fleetserve.runtimes.onnx")

DEFAULT_MIN_COSINE = 0.999
PRECISIONS = ("fp32", "int8")
Feed = dict[str, Array]


class OnnxRuntime:
    name = "onnx"

    def __init__(
        self,
        device: str = "auto",
        precision: str = "fp32",
        threads: int = 0,
        cache_dir: Path = DEFAULT_CACHE,
        *,
        min_cosine: float = DEFAULT_MIN_COSINE,
        console: Console | None = None,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"the onnx runtime runs {' or '.join(PRECISIONS)}, not {precision!r}")
        self.device = _resolve(device)
        self.requested_precision = precision
        self.precision = precision  # what runs once loaded: int8 falls back to fp32
        self.threads = threads
        self.cache_dir = Path(cache_dir)
        self.min_cosine = min_cosine
        self.console = console
        self.head = Head.BASE
        self.export: Export | None = None  # the cache entry in use, with the int8 guard
        self._session: OrtSession | None = None
        self._outputs: tuple[Output, ...] = ()
        self._types = False
        self._bytes = 0

    def load(self, path: Path, head: Head = Head.BASE) -> None:
        head = Head(head)
        precision = self.requested_precision
        if precision == "int8" and self.device != "cpu":
            log.warning("int8 is a CPU feature of ONNX Runtime; running fp32 on %s", self.device)
            precision = "fp32"
        exp, sess = self._open(Path(path), head, precision)
        self._session, self.export, self.head = sess, exp, head
        self.precision = exp.precision
        self._outputs = tuple(Output(o.name) for o in sess.get_outputs())
        self._types = "token_type_ids" in {i.name for i in sess.get_inputs()}
        self._bytes = exp.model.stat().st_size

    def _open(self, path: Path, head: Head, precision: str) -> tuple[Export, OrtSession]:
        """The cached graph and a session on it; an entry that does not load is rebuilt once."""
        from .onnx_export import export_model

        for attempt in range(2):
            exp = export_model(
                path,
                head,
                cache_dir=self.cache_dir,
                precision=precision,
                min_cosine=self.min_cosine,
                console=self.console,
            )
            try:
                return exp, session(exp.model, _providers(self.device), self.threads)
            except Exception as exc:  # onnxruntime's errors derive from Exception only
                if attempt or not _is_ort_error(exc):
                    raise
                log.warning("cache entry %s does not load (%s); rebuilding it", exp.entry, exc)
                shutil.rmtree(exp.entry, ignore_errors=True)
        raise AssertionError("unreachable")

    def run(
        self,
        input_ids: Array,
        attention_mask: Array,
        output: Output,
        token_type_ids: Array | None = None,
    ) -> Array:
        if self._session is None:
            raise RuntimeError("model is not loaded")
        output = Output(output)
        if output not in self._outputs:
            have = ", ".join(self._outputs)
            raise ValueError(f"the {self.head} head gives {have}, not {output}")
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ascontiguousarray(attention_mask, np.int64)}
        if self._types:
            types = np.zeros_like(ids) if token_type_ids is None else token_type_ids
            feed["token_type_ids"] = np.ascontiguousarray(types, dtype=np.int64)
        (out,) = self._session.run([output.value], feed)
        return np.asarray(out, dtype=np.float32)

    def memory_bytes(self) -> int:
        """The size of the loaded graph file: its weights, fp32 or int8."""
        return self._bytes


def _is_ort_error(exc: Exception) -> bool:
    return type(exc).__module__.startswith("onnxruntime")


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


def _resolve(device: str) -> str:
    if device == "auto":
        return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
    return device


def _providers(device: str) -> list[Provider]:
    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError(
            f"device {device}: this onnxruntime has no CUDA (pip install onnxruntime-gpu)"
        )
    index = int(device.partition(":")[2] or 0)
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


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


CALIBRATION = (
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password?",
    "Stock markets fell sharply on Monday after the central bank raised interest rates.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Je pense, donc je suis.",
    "SELECT name, email FROM users WHERE id = 42;",
    "I loved this movie, the acting was superb!",
    "Terrible service. We waited an hour and the food was cold.",
    "What is the capital of Australia?",
    "def add(a, b):\n    return a + b",
    "The patient was prescribed 500 mg of amoxicillin three times a day.",
    "Barack Obama was born in Honolulu, Hawaii, on August 4, 1961.",
    "river bank",
    "money bank",
    "Shipping is free for orders over $50 within the continental US.",
    "The mitochondria is the powerhouse of the cell.",
    "Please find attached the invoice for March; payment is due in 30 days.",
    "A cat sat on the mat.",
    "Neural networks learn representations by gradient descent on a loss function.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Can vector search replace keyword search for e-commerce queries?",
    "ERROR 2024-05-01T12:00:03Z connection refused (retrying in 5s)",
    "The court ruled that the contract was void because it lacked consideration.",
    "Add two cups of flour, a pinch of salt, and stir until smooth.",
    "Who won the FIFA World Cup in 2018?",
    "Our quarterly revenue grew 12% year over year, driven by cloud subscriptions.",
    "yes",
    "The Eiffel Tower is 330 metres tall and was completed in 1889.",
    "Hello!! 😀 how r u doing today???",
    "Quantum entanglement links the states of two particles regardless of distance.",
    "Reboot the router, then check whether the status light turns green.",
    "In 1492 Columbus sailed the ocean blue, reaching the Bahamas in October.",
)
