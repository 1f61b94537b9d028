"""The torch module that the ONNX and OpenVINO converters trace: a checkpoint with one
head, wrapped so that every output of that head (``OUTPUTS``), pooling and SPLADE
included, is an output of one graph.

Importing this module needs neither torch nor transformers (serving from a cache reads
``OUTPUTS``); ``head_graph`` imports them to convert.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..wire.values import Array
from .base import Head, Output

if TYPE_CHECKING:
    import torch

TRACING = threading.Lock()
"""Held while a head graph is traced (an ONNX export, an OpenVINO conversion): each
silences the tracer's notes with ``warnings.catch_warnings``, which swaps the process's
one list of filters, so two traces on two threads at once would each put back the
other's (a background fit of LoRA slots beside a load's conversion)."""

OUTPUTS: dict[Head, tuple[Output, ...]] = {
    Head.BASE: (Output.MEAN, Output.CLS, Output.HIDDEN),
    Head.MASKED_LM: (Output.LOGITS, Output.SPLADE),
    Head.SEQUENCE_CLASSIFICATION: (Output.LOGITS,),
    Head.TOKEN_CLASSIFICATION: (Output.LOGITS,),
}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
Feed = dict[str, Array]


def per_token(head: Head, output: Output) -> bool:
    """Whether ``output`` has a sequence axis: ``[batch, seq, ...]``."""
    return output is Output.HIDDEN or (
        output is Output.LOGITS and head is not Head.SEQUENCE_CLASSIFICATION
    )


@dataclass(frozen=True, slots=True)
class HeadGraph:
    """The wrapped module (a ``torch.nn.Module`` in eval mode), its input names in
    order (``token_type_ids`` only where the model takes it) and its outputs."""

    module: torch.nn.Module
    head: Head
    inputs: tuple[str, ...]
    outputs: tuple[Output, ...]
    vocab: int

    def example(self, batch: int, seq: int, seed: int = 0) -> Feed:
        """Token ids with the last row half padded, so a trace keeps the attention mask."""
        rng = np.random.default_rng(seed)
        ids = rng.integers(min(5, self.vocab - 1), self.vocab, (batch, seq), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[-1, seq // 2 :] = 0
        feed = {"input_ids": ids * mask, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        return feed

    def tensors(self, feed: Feed) -> tuple[torch.Tensor, ...]:
        """``feed`` as torch tensors, in input order."""
        import torch

        return tuple(torch.from_numpy(feed[n]) for n in self.inputs)

    def reference(self, feed: Feed) -> list[Array]:
        """What torch gives for ``feed``: one float32 array per output."""
        import torch

        with torch.no_grad():
            return [t.numpy() for t in self.module(*self.tensors(feed))]

    def check(self, path: Path, got: list[Array], want: list[Array], what: str) -> None:
        """Raise unless ``got`` (the converted graph's outputs) matches torch's ``want``."""
        for o, w, g in zip(self.outputs, want, got, strict=True):
            if not np.allclose(g, w, rtol=1e-3, atol=1e-4 * (1.0 + float(np.abs(w).max()))):
                raise RuntimeError(f"the {what} of {path} disagrees with torch on {o}")


def head_graph(path: Path, head: Head, *, what: str) -> HeadGraph:
    """Load ``path`` with ``head`` (fp32, eager attention) and wrap it. ``what`` names
    the conversion ("ONNX export", "OpenVINO IR") in the error raised without torch."""
    try:
        import torch

        from .checked_load import load_checked
        from .torch import _CLASSES, HEAD_NAMES, _reduce, unread_by
    except ImportError as exc:
        raise ImportError(
            f"{path} has no {what} in the cache, and converting it needs torch: "
            f"pip install 'fleetserve[torch]', or prepare it where torch is installed"
        ) from exc

    model = load_checked(
        _CLASSES[head],
        path,
        HEAD_NAMES[head],
        unread=unread_by(head),
        dtype=torch.float32,
        attn_implementation="eager",
    )
    model.eval()
    with_types = "token_type_ids" in inspect.signature(model.forward).parameters
    outputs = OUTPUTS[head]

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, ...]:
            kw = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kw["token_type_ids"] = token_type_ids
            result = self.model(**kw)
            return tuple(_reduce(result, attention_mask, o).float() for o in outputs)

    inputs = INPUTS if with_types else INPUTS[:2]
    vocab = int(model.config.vocab_size)
    return HeadGraph(Graph().eval(), head, inputs, outputs, vocab)
