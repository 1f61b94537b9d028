"""Tiny random BERTs with each runtime head (hidden 32, 2 layers), built in milliseconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fleetserve.runtimes import Head, Output

from .tinymodels import build_tokenizer

NUM_LABELS = {Head.SEQUENCE_CLASSIFICATION: 3, Head.TOKEN_CLASSIFICATION: 5}


def model_class(head: Head) -> Any:
    import transformers

    return {
        Head.BASE: transformers.BertModel,
        Head.MASKED_LM: transformers.BertForMaskedLM,
        Head.SEQUENCE_CLASSIFICATION: transformers.BertForSequenceClassification,
        Head.TOKEN_CLASSIFICATION: transformers.BertForTokenClassification,
    }[head]


def build_head(path: Path, head: Head, *, seed: int = 0, outliers: bool = False) -> Path:
    """A BERT with ``head`` and its WordPiece tokenizer. Token type embeddings are drawn
    large so that segments matter. ``outliers`` draws large weights and plants one 50x
    larger in every output channel of every linear layer: int8 then loses the rest."""
    import torch
    from transformers import BertConfig

    build_tokenizer(path)
    vocab_size = len((path / "vocab.txt").read_text().split())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=NUM_LABELS.get(head, 2),
        pad_token_id=0,
        initializer_range=0.3 if outliers else 0.02,
    )
    model = model_class(head)(config).eval()
    base = model if head is Head.BASE else model.bert
    with torch.no_grad():
        base.embeddings.token_type_embeddings.weight.normal_(0.0, 1.0)
        if outliers:
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight[:, 0] = 50.0 * module.weight.abs().max()
    model.save_pretrained(str(path))
    return path


def batch(path: Path, texts: list[str], pairs: list[str] | None = None) -> dict[str, Any]:
    """Padded int64 input_ids, attention_mask and token_type_ids for ``texts``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    encs = tok.encode_batch(list(zip(texts, pairs, strict=True)) if pairs else texts)
    width = max(len(e.ids) for e in encs)
    out = {k: np.zeros((len(encs), width), np.int64) for k in ("ids", "mask", "types")}
    for i, e in enumerate(encs):
        n = len(e.ids)
        out["ids"][i, :n] = e.ids
        out["mask"][i, :n] = 1
        out["types"][i, :n] = e.type_ids
    return out


def head_output(model: Any, head: Head, output: Output, x: dict[str, Any]) -> Any:
    """``output`` of a transformers (or PEFT) ``model`` with ``head`` for the ``batch``
    ``x``, reduced with numpy (independently of the runtimes)."""
    import torch

    with torch.no_grad():
        result = model(
            input_ids=torch.from_numpy(x["ids"]),
            attention_mask=torch.from_numpy(x["mask"]),
            token_type_ids=torch.from_numpy(x["types"]),
        )
    m = x["mask"][..., None].astype(np.float32)
    if head is not Head.BASE:
        logits = result.logits.numpy()
        if output is Output.SPLADE:
            return np.max(np.log1p(np.maximum(logits, 0.0)) * m, axis=1)
        return logits
    hidden = result.last_hidden_state.numpy()
    if output is Output.HIDDEN:
        return hidden
    if output is Output.CLS:
        return hidden[:, 0]
    return (hidden * m).sum(1) / m.sum(1)
