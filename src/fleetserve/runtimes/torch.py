"""The torch (transformers) runtime: fp32, bf16 and fp16, on CPU or CUDA.

fp16 casts the weights to half precision on every device (on CPUs with AVX512-FP16
oneDNN runs the matmuls natively). bf16 casts them on CUDA and uses autocast on CPU,
where bf16 weights lose too much (cosine < 0.9999 on MiniLM). Pooling is done in
fp32. Call ``encode`` from one dedicated thread: torch releases the GIL during the
forward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..catalog.rules import install_hint

try:
    import torch
    from transformers import (
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the torch runtime needs torch and transformers: " + install_hint("torch")
    ) from exc

from ..wire.values import Array
from .base import Head, Output
from .cache import DEFAULT_CACHE
from .checked_load import UNREAD_BY_ENCODERS, load_checked
from .mapped import Mapping, map_weights, mapped_key

if TYPE_CHECKING:
    from ..lora.mixed import LoraBank

_CLASSES: dict[Head, Any] = {
    Head.BASE: AutoModel,
    Head.MASKED_LM: AutoModelForMaskedLM,
    Head.SEQUENCE_CLASSIFICATION: AutoModelForSequenceClassification,
    Head.TOKEN_CLASSIFICATION: AutoModelForTokenClassification,
}
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HEAD_NAMES: dict[Head, str] = {  # for a load's error: what the checkpoint lacks
    Head.BASE: "encoder",
    Head.MASKED_LM: "masked-LM head (sparse)",
    Head.SEQUENCE_CLASSIFICATION: "sequence-classification head (cross_encoder, zero_shot)",
    Head.TOKEN_CLASSIFICATION: "token-classification head (ner)",
}


def unread_by(head: Head) -> tuple[str, ...]:
    """Modules whose weights ``head``'s outputs never read (may be absent)."""
    return UNREAD_BY_ENCODERS if head is Head.BASE else ()


def resolve_device(device: str) -> str:
    """``auto`` picks CUDA when present, else CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class TorchRuntime:
    """``compile``: run the forward through ``torch.compile`` (dynamic shapes), which
    compiles on the first batch and again on shapes it has not specialized for; the
    tuner offers it as ``torch_compile`` and keeps it only where that pays.

    On a CPU, a model may sleep (``Sleeps``): ``prepare_sleep`` puts its weights on a
    mapped copy in ``cache_dir/mapped/`` (``mapped.py``). Not with ``compile`` (the
    compiled graph holds the tensors it was traced with) nor once LoRA adapters wrap
    its linears (their banks change in place)."""

    name = "torch"
    takes_adapters = True  # LoRA adapters, mixed per row (lora_bank)

    def __init__(
        self,
        device: str = "auto",
        precision: str = "fp32",
        threads: int = 0,
        *,
        compile: bool = False,
        cache_dir: Path = DEFAULT_CACHE,
    ) -> None:
        if precision not in _DTYPES:
            raise ValueError(f"precision must be one of {sorted(_DTYPES)}, not {precision!r}")
        self.device = resolve_device(device)
        self.precision = precision
        self.compile = compile
        self._forward: Callable[..., Any] | None = None
        if threads > 0:
            torch.set_num_threads(threads)
        self._model: torch.nn.Module | None = None
        self._bank: LoraBank | None = None
        self.head = Head.BASE
        self.cache_dir = Path(cache_dir)
        self._path: Path | None = None
        self._mapping: Mapping | None = None

    def load(self, path: Path, head: Head = Head.BASE) -> None:
        on_cuda = self.device.startswith("cuda")
        cast = self.precision == "fp16" or (on_cuda and self.precision == "bf16")
        dtype = _DTYPES[self.precision] if cast else torch.float32
        head = Head(head)
        model = load_checked(
            _CLASSES[head], path, HEAD_NAMES[head], unread=unread_by(head), dtype=dtype
        )
        self._model = model.to(self.device).eval()
        self._forward = torch.compile(self._model, dynamic=True) if self.compile else self._model
        self._bank = None
        self.head = head
        self._path, self._mapping = Path(path), None

    def lora_bank(self) -> LoraBank:
        """The loaded model's LoRA adapters (mixed per row; see :mod:`fleetserve.lora`).
        Adapters wrap the model's linear layers, so a compiled forward gives way to the
        eager one."""
        if self._bank is None:
            from ..lora.mixed import LoraBank
            from ..lora.shapes import match_modules

            # the deltas run at the precision the matmuls run at (bf16 under autocast)
            self._bank = LoraBank(self.model, match_modules, dtype=_DTYPES[self.precision])
            self._forward = self._model
        return self._bank

    def prepare_sleep(self) -> int:
        if self._mapping is None and self._can_sleep():
            assert self._model is not None and self._path is not None
            key = mapped_key(self._path, self.head.value, self.precision)
            self._mapping = map_weights(self._model, self.cache_dir / "mapped" / key)
            # every page in now, as a wake brings them: a batch reads only its tokens'
            # rows of the embeddings, so the load would measure (and charge) less
            self._mapping.populate()
        return self._mapping.nbytes if self._mapping is not None else 0

    def _can_sleep(self) -> bool:
        return (
            self._model is not None and self.device == "cpu" and not self.compile
            and self._bank is None
        )  # fmt: skip

    def sleep(self) -> int:
        if self._mapping is None or not self._can_sleep():
            return 0
        self._mapping.release()
        return self._mapping.nbytes

    def wake(self) -> None:
        if self._mapping is not None:
            self._mapping.populate()

    @property
    def model(self) -> torch.nn.Module:
        """The loaded ``torch.nn.Module`` (for families that need more than ``run``)."""
        if self._model is None:
            raise RuntimeError("model is not loaded")
        return self._model

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.precision != "bf16" or self.device.startswith("cuda"):
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=_DTYPES[self.precision])

    def run(
        self,
        input_ids: Array,
        attention_mask: Array,
        output: Output,
        token_type_ids: Array | None = None,
    ) -> Array:
        model = self.model
        ids = torch.from_numpy(input_ids).to(self.device, non_blocking=True)
        mask = torch.from_numpy(attention_mask).to(self.device, non_blocking=True)
        kwargs: dict[str, object] = {"input_ids": ids, "attention_mask": mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = torch.from_numpy(token_type_ids).to(self.device)
        with torch.inference_mode(), self.autocast():
            forward = model if self._forward is None else self._forward  # no bool(): a
            result = forward(**kwargs)  # compiled module's __len__ raises
            out = _reduce(result, mask, Output(output))
        arr: Array = out.float().cpu().numpy()
        return arr

    def memory_bytes(self) -> int:
        if self._model is None:
            return 0
        return int(sum(p.numel() * p.element_size() for p in self._model.parameters()))


def _reduce(result: Any, mask: torch.Tensor, output: Output) -> Any:
    if output is Output.LOGITS:
        return result.logits
    if output is Output.SPLADE:
        # log1p(relu(x)) never decreases in x, so the max over tokens can come first:
        # one [batch, vocab] activation instead of three [batch, seq, vocab] temporaries
        logits = result.logits.float()
        logits = logits.masked_fill(~mask.bool().unsqueeze(-1), float("-inf"))
        return torch.log1p(torch.relu(logits.amax(dim=1)))
    hidden = result.last_hidden_state.float()
    if output is Output.HIDDEN:
        return hidden
    if output is Output.CLS:
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
