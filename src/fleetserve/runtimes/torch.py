"""The torch (transformers) runtime: fp32, bf16 and fp16, on CPU or CUDA.

fp16 casts the weights to half precision on every device (on CPUs with AVX512-FP16
oneDNN runs the matmuls natively). bf16 casts them on CUDA and uses autocast on CPU,
where bf16 weights lose too much (cosine < 0.9999 on MiniLM). Pooling is done in
fp32. Call ``encode`` from one dedicated thread: torch releases the GIL during the
forward pass.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    from transformers import AutoModel
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the torch runtime needs torch and transformers: pip install 'fleetserve[torch]' "
        "-c requirements/constraints.txt"
    ) from exc

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(device: str) -> str:
    """``auto`` picks CUDA when present, else CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def hardware_class(device: str) -> str:
    return "cuda" if resolve_device(device).startswith("cuda") else "cpu"


class TorchRuntime:
    name = "torch"

    def __init__(self, device: str = "auto", precision: str = "fp32", threads: int = 0) -> None:
        if precision not in _DTYPES:
            raise ValueError(f"precision must be one of {sorted(_DTYPES)}, not {precision!r}")
        self.device = resolve_device(device)
        self.precision = precision
        if threads > 0:
            torch.set_num_threads(threads)
        self._model: Any = None

    def load_encoder(self, path: Path) -> None:
        on_cuda = self.device.startswith("cuda")
        cast = self.precision == "fp16" or (on_cuda and self.precision == "bf16")
        dtype = _DTYPES[self.precision] if cast else torch.float32
        model = AutoModel.from_pretrained(str(path), dtype=dtype)
        self._model = model.to(self.device).eval()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision != "bf16" or self.device.startswith("cuda"):
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=_DTYPES[self.precision])

    def encode(
        self, input_ids: np.ndarray[Any, Any], attention_mask: np.ndarray[Any, Any], pooling: str
    ) -> np.ndarray[Any, Any]:
        if self._model is None:
            raise RuntimeError("model is not loaded")
        ids = torch.from_numpy(input_ids).to(self.device, non_blocking=True)
        mask = torch.from_numpy(attention_mask).to(self.device, non_blocking=True)
        with torch.inference_mode(), self._autocast():
            hidden = self._model(input_ids=ids, attention_mask=mask).last_hidden_state
            hidden = hidden.float()
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                m = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        out: np.ndarray[Any, Any] = pooled.cpu().numpy()
        return out

    def memory_bytes(self) -> int:
        if self._model is None:
            return 0
        return int(sum(p.numel() * p.element_size() for p in self._model.parameters()))
