"""The Runtime protocol: what a model family needs from an inference engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Runtime(Protocol):
    """Loads weights and runs forward passes. One instance per (model, device)."""

    name: str
    device: str
    precision: str

    def load_encoder(self, path: Path) -> None:
        """Load an encoder (BERT-like) model from a local directory."""
        ...

    def encode(
        self, input_ids: np.ndarray[Any, Any], attention_mask: np.ndarray[Any, Any], pooling: str
    ) -> np.ndarray[Any, Any]:
        """Pooled float32 embeddings ``[batch, dim]`` for a padded batch."""
        ...

    def memory_bytes(self) -> int:
        """Bytes held by the loaded weights."""
        ...
