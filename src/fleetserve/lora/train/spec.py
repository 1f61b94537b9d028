"""What one training run is (``TrainSpec``), what it gives back (``TrainResult``), and
the fingerprint its checkpoints carry (``spec_fingerprint``). A run trains an embedder
(``EMBED``: a dense base, bi-encoder losses) or a reranker (``RERANK``: a cross-encoder
base, whose hard negatives a bi-encoder, the ``Miner``, mines)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...wire.finetune import Hyperparameters, Pair
from .checkpoint import CHECKPOINT_FORMAT
from .ireval import Scores

EMBED, RERANK = "embed", "rerank"  # what a run trains: an embedder, a reranker


@dataclass(frozen=True)
class Miner:
    """The bi-encoder a reranker's run retrieves with: its local Hugging Face model
    directory and the served spec's pooling, normalisation and sequence length."""

    path: str
    pooling: str
    normalize: bool
    max_seq_len: int


@dataclass(frozen=True)
class TrainSpec:
    """One training run. ``base_path``: a local Hugging Face model directory;
    ``pooling``/``normalize``/``max_seq_len``: the served spec's; ``resume``: a
    checkpoint blob from an earlier run of the same spec; ``memory_share``: the bytes
    the run may grow by (``share.py``; 0: as much as it takes); ``kind``: ``EMBED`` or
    ``RERANK`` (then ``miner`` mines its negatives and picks the candidates it is
    measured on, and ``pooling``/``normalize`` are not used)."""

    base_path: str
    pooling: str
    normalize: bool
    max_seq_len: int
    train: tuple[Pair, ...]
    validation: tuple[Pair, ...]
    hyperparameters: Hyperparameters
    threads: int = 1
    seed: int = 0
    resume: bytes | None = None
    memory_share: int = 0
    kind: str = EMBED
    miner: Miner | None = None


@dataclass(frozen=True)
class TrainResult:
    """The adapter's two files and the figures. ``steps``: optimizer steps this run
    took; ``train_seconds``: the training loop's wall time (not measuring or mining);
    ``epochs``: the job's total; ``mined_negatives``: negatives mined over all rows;
    ``memory``: the run's resident-set ``peak_growth`` and, within a share, the
    ``share``, ``micro_batch`` and ``max_seq_len`` it ran at (bytes and counts)."""

    config: bytes
    weights: bytes
    base: Scores
    adapter: Scores
    train_seconds: float
    steps: int
    epochs: int
    resumed_from_epoch: int
    pairs: int
    mined_negatives: int
    memory: dict[str, int] = field(default_factory=dict)


def spec_fingerprint(spec: TrainSpec) -> str:
    """A digest of what the trained weights depend on: the base's files (by content,
    not path, so another worker's copy matches), the pairs, pooling, sequence length,
    hyperparameters and seed; a reranker's, its miner's files and settings too. Not the
    threads."""
    digest = hashlib.sha256()
    _weights(digest.update, Path(spec.base_path))
    if spec.miner is not None:
        digest.update(b"miner\0")
        _weights(digest.update, Path(spec.miner.path))
    described = {
        "format": CHECKPOINT_FORMAT,
        "pooling": spec.pooling,
        "normalize": spec.normalize,
        "max_seq_len": spec.max_seq_len,
        "hyperparameters": spec.hyperparameters.to_dict(),
        "seed": spec.seed,
        "train": [p.to_dict() for p in spec.train],
        "validation": [p.to_dict() for p in spec.validation],
    }
    if spec.kind != EMBED:  # (an embedder's fingerprint is what it was before kinds)
        described["kind"] = spec.kind
    if spec.miner is not None:
        m = spec.miner
        described["miner"] = [m.pooling, m.normalize, m.max_seq_len]
    digest.update(json.dumps(described, sort_keys=True).encode())
    return digest.hexdigest()


def _weights(update: Callable[[bytes], None], model: Path) -> None:
    """A model directory's config and weights, by content, into a digest's ``update``."""
    for f in sorted(model.iterdir()):
        if f.name == "config.json" or f.suffix in (".safetensors", ".bin"):
            update(f.name.encode() + b"\0")
            with f.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    update(chunk)


__all__ = ["EMBED", "RERANK", "Miner", "TrainResult", "TrainSpec", "spec_fingerprint"]
