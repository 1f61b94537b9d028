"""What one training run is (``TrainSpec``), what it gives back (``TrainResult``), and
the fingerprint its checkpoints carry (``spec_fingerprint``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ...wire.finetune import Hyperparameters, Pair
from .checkpoint import CHECKPOINT_FORMAT
from .ireval import Scores


@dataclass(frozen=True)
class TrainSpec:
    """One training run. ``base_path``: a local Hugging Face model directory;
    ``pooling``/``normalize``/``max_seq_len``: the served spec's; ``resume``: a
    checkpoint blob from an earlier run of the same spec; ``memory_share``: the bytes
    the run may grow by (``share.py``; 0: as much as it takes)."""

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
    hyperparameters and seed. Not the threads."""
    digest = hashlib.sha256()
    base = Path(spec.base_path)
    for f in sorted(base.iterdir()):
        if f.name == "config.json" or f.suffix in (".safetensors", ".bin"):
            digest.update(f.name.encode() + b"\0")
            with f.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
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
    digest.update(json.dumps(described, sort_keys=True).encode())
    return digest.hexdigest()


__all__ = ["TrainResult", "TrainSpec", "spec_fingerprint"]
