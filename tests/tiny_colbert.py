"""Tiny ColBERT checkpoints (hidden 32, 2 layers, projection to 16) in both layouts.

- HF (stanford-nlp): ``bert.*`` weights and ``linear.weight`` in one model.safetensors,
  architecture ``HF_ColBERT``, ``artifact.metadata`` with markers and lengths.
- PyLate: a plain BERT at the root, ``modules.json``, a Dense module in ``1_Dense/``
  (with a bias), ``config_sentence_transformers.json`` with ``[Q] ``/``[D] `` markers
  added to the tokenizer.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from .tinymodels import save_tokenizer, wordpiece

QUERY_LENGTH = 8
DOC_LENGTH = 12
PUNCT = list(string.punctuation)  # in the vocabulary, as in a real BERT's


def build_tokenizer(path: Path, added: tuple[str, ...] = ()) -> int:
    """A BERT WordPiece tokenizer with ColBERT's unused markers and ASCII punctuation;
    returns the vocabulary size (added tokens included)."""
    from tokenizers import AddedToken

    tok, vocab = wordpiece(["[unused0]", "[unused1]", *PUNCT])
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    if added:
        tok.add_tokens([AddedToken(a, normalized=False) for a in added])
    save_tokenizer(tok, vocab, path)
    return int(tok.get_vocab_size())


def _bert(vocab_size: int, seed: int):  # type: ignore[no-untyped-def]
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(config, add_pooling_layer=False).eval()


def build_hf_colbert(path: Path, *, out_dim: int = 16, seed: int = 0) -> Path:
    import torch
    from safetensors.torch import save_file

    model = _bert(build_tokenizer(path), seed)
    state = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
    state["linear.weight"] = torch.randn(out_dim, 32)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    model.config.architectures = ["HF_ColBERT"]
    model.config.save_pretrained(str(path))
    meta = {
        "query_token_id": "[unused0]",
        "doc_token_id": "[unused1]",
        "query_maxlen": QUERY_LENGTH,
        "doc_maxlen": DOC_LENGTH,
        "dim": out_dim,  # as stanford-nlp checkpoints say it (colbert-ai builds its linear by it)
        "mask_punctuation": True,
        "attend_to_mask_tokens": False,
    }
    (path / "artifact.metadata").write_text(json.dumps(meta))
    return path


def build_pylate_colbert(path: Path, *, out_dim: int = 16, seed: int = 1) -> Path:
    import torch
    from safetensors.torch import save_file

    model = _bert(build_tokenizer(path, ("[Q] ", "[D] ")), seed)
    model.save_pretrained(str(path))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    dense = path / "1_Dense"
    dense.mkdir()
    cfg = {
        "in_features": 32,
        "out_features": out_dim,
        "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity",
        "use_residual": False,
    }
    (dense / "config.json").write_text(json.dumps(cfg))
    weights = {"linear.weight": torch.randn(out_dim, 32), "linear.bias": torch.randn(out_dim)}
    save_file(weights, str(dense / "model.safetensors"), metadata={"format": "pt"})
    st = {
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": QUERY_LENGTH,
        "document_length": DOC_LENGTH,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
    }
    (path / "config_sentence_transformers.json").write_text(json.dumps(st))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 11}))
    return path
