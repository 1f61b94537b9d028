"""``python -m benchmarks usermodel``: a user's own 110M-parameter sentence-transformers
model, declared with a two-line spec, for the tuner's and selftune's "user model" rows.

No hub is reachable here, so the model is BERT-base's shape (12 layers, 768 wide,
109M parameters) with seeded random weights and all-MiniLM-L6-v2's tokenizer and mean
pooling, in the sentence-transformers layout. Throughput and the quality gate's
comparisons depend on the shapes and the arithmetic, not on what the weights learnt.
Writes ``<out>/bert-base-st/`` and ``<out>/catalog/bert.yaml``::

    id: me/bert-base-st
    sources: [<out>/bert-base-st]
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

MODEL_ID = "me/bert-base-st"


def main(argv: Sequence[str] = ()) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks usermodel")
    p.add_argument("--out", default=".bench/user", help="where the model and catalog go")
    args = p.parse_args(list(argv))
    import torch
    from transformers import BertConfig, BertModel

    from fleetserve.assembly import HF_CACHE
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve

    mini = Catalog.load([]).get("sentence-transformers/all-MiniLM-L6-v2")
    src = resolve(mini.id, mini.sources, HF_CACHE)
    out = Path(args.out).resolve()
    model = out / "bert-base-st"
    shutil.rmtree(model, ignore_errors=True)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512,
    )  # fmt: skip
    bert = BertModel(config)
    bert.save_pretrained(model, safe_serialization=True)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special_tokens", "modules", "sentence_")):
            shutil.copy(f, model / f.name)
    shutil.copytree(src / "1_Pooling", model / "1_Pooling")
    pooling = model / "1_Pooling" / "config.json"
    doc = json.loads(pooling.read_text())
    doc["word_embedding_dimension"] = config.hidden_size
    pooling.write_text(json.dumps(doc, indent=2))
    catalog = out / "catalog"
    catalog.mkdir(parents=True, exist_ok=True)
    (catalog / "bert.yaml").write_text(f"id: {MODEL_ID}\nsources: [{model}]\n")
    n = sum(t.numel() for t in bert.parameters())
    print(f"{MODEL_ID}: {n / 1e6:.0f}M parameters at {model}; spec {catalog / 'bert.yaml'}")
    return 0
