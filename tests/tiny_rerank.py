"""A tiny random cross-encoder (BertForSequenceClassification), built in milliseconds."""

from __future__ import annotations

from pathlib import Path

from .tinymodels import build_tokenizer


def build_cross_encoder(
    path: Path, *, seed: int = 0, num_labels: int = 1, max_positions: int = 128
) -> Path:
    """A BERT cross-encoder with hidden size 32 and 2 layers, plus its WordPiece tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    build_tokenizer(path)
    vocab_size = len((path / "vocab.txt").read_text().split())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        num_labels=num_labels,
        pad_token_id=0,
        initializer_range=0.3,
    )
    model = BertForSequenceClassification(config).eval()
    # random init leaves the token type embeddings near zero; make segments matter
    with torch.no_grad():
        model.bert.embeddings.token_type_embeddings.weight.normal_(0.0, 1.0)
    model.save_pretrained(str(path))
    return path
