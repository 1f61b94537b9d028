"""Tiny random models and tokenizers, built in milliseconds, for tests (no downloads)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "and",
    "in",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "this",
    "that",
    "be",
    "are",
    "or",
    "not",
    "hello",
    "world",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "cat",
    "sat",
    "mat",
    "model",
    "serve",
    "fleet",
    "small",
    "open",
    "vector",
    "search",
    "query",
    "document",
    "river",
    "bank",
    "money",
    "finance",
    "water",
]


def wordpiece(extra: Sequence[str] = ()) -> tuple[Any, dict[str, int]]:
    """A lowercasing BERT WordPiece tokenizer over a tiny vocabulary: the specials, then
    ``extra``, letters and words; returns it and its vocabulary."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab_list = specials + list(extra) + letters + ["##" + ch for ch in letters] + WORDS
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(vocab_list))}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return tok, vocab


def save_tokenizer(tok: Any, vocab: dict[str, int], path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")


def build_tokenizer(path: Path) -> None:
    from tokenizers import decoders

    tok, vocab = wordpiece()
    tok.decoder = decoders.WordPiece()
    save_tokenizer(tok, vocab, path)


def build_bert(
    path: Path, *, seed: int = 0, max_positions: int = 128, hidden: int = 32, layers: int = 2
) -> Path:
    """A BERT encoder (hidden size 32 and 2 layers unless asked), plus its tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    build_tokenizer(path)
    vocab_size = len((path / "vocab.txt").read_text().split())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_positions,
    )
    BertModel(config).eval().save_pretrained(str(path))
    return path


def write_spec(catalog_dir: Path, model_id: str, source: Path, **extra: object) -> Path:
    import yaml

    catalog_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "id": model_id,
        "family": "dense",
        "runtime": "torch",
        "sources": [str(source)],
        "pooling": "mean",
        "normalize": True,
        "max_seq_len": 16,
        "dimensions": 32,
        "profiles": {"cpu": {"precision": "fp32", "max_batch_tokens": 256, "max_batch_size": 8}},
    }
    spec.update(extra)
    f = catalog_dir / (model_id.replace("/", "__") + ".yaml")
    f.write_text(yaml.safe_dump(spec))
    return f
