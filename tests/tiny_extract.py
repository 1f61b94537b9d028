"""Tiny random token- and sequence-classification BERTs for the extraction families.

Built in milliseconds with the shared tiny tokenizer. The classifier heads get a large
initial scale so that argmax decisions are far from ties and spans actually appear.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .tinymodels import build_tokenizer

NER_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
NLI_LABELS = ["contradiction", "neutral", "entailment"]  # the MNLI order


def _config(path: Path, labels: list[str], max_positions: int, init: float = 0.02) -> Any:
    from transformers import BertConfig

    build_tokenizer(path)
    # transformers' AutoTokenizer needs to know the class; our own loader reads tokenizer.json
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "model_max_length": max_positions})
    )
    vocab_size = len((path / "vocab.txt").read_text().split())
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        initializer_range=init,
    )


def build_token_classifier(
    path: Path, *, labels: list[str] | None = None, seed: int = 0, max_positions: int = 128
) -> Path:
    """A ``BertForTokenClassification`` with BIO labels (``NER_LABELS`` by default)."""
    import torch
    from transformers import BertForTokenClassification

    config = _config(path, labels or NER_LABELS, max_positions)
    torch.manual_seed(seed)
    model = BertForTokenClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0)
    model.save_pretrained(str(path))
    return path


def build_nli_classifier(path: Path, *, seed: int = 0, max_positions: int = 128) -> Path:
    """A ``BertForSequenceClassification`` with an MNLI label config."""
    import torch
    from transformers import BertForSequenceClassification

    config = _config(path, NLI_LABELS, max_positions, init=0.3)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.bert.pooler.dense.weight.normal_(0.0, 0.1)
        model.classifier.weight.normal_(0.0, 1.0)
    model.save_pretrained(str(path))
    return path


# -- calling an adapter directly, as the worker does ---------------------------------


def envelope(model: str, accept: Any = None, task: Any = None) -> Any:
    from fleetserve.wire import Encoding, Envelope, Task

    return Envelope(
        "r", model, task or Task.EXTRACT, Encoding.JSON, accept or Encoding.JSON, 0, 0.0
    )


def make_family(family: str, path: Path, runtime: Any = None, **spec: Any) -> Any:
    """A loaded adapter of ``family`` over ``path`` (torch on CPU unless given)."""
    from fleetserve.catalog import ModelSpec
    from fleetserve.families import create_family

    if runtime is None:
        from fleetserve.runtimes.torch import TorchRuntime

        runtime = TorchRuntime("cpu")
    full: dict[str, Any] = {"id": f"tiny/{family}", "family": family, "sources": [str(path)]}
    full.update(spec)
    adapter = create_family(ModelSpec.from_dict(full), runtime, path)
    adapter.load()
    adapter.warmup()
    return adapter


def call(adapter: Any, body: dict[str, Any], accept: Any = None) -> Any:
    """One request through preprocess, forward and postprocess; the decoded reply."""
    return call_together(adapter, [body], accept)[0]


def call_together(adapter: Any, bodies: list[dict[str, Any]], accept: Any = None) -> list[Any]:
    """Several requests whose items share one forward batch, as the worker batches them."""
    import msgspec

    from fleetserve.wire import Encoding

    env = envelope(adapter.spec.id, accept)
    preps = [adapter.preprocess(env, msgspec.json.encode(b)) for b in bodies]
    outputs = list(adapter.forward([it for p in preps for it in p.items]))
    replies = []
    for p in preps:
        mine, outputs = outputs[: len(p.items)], outputs[len(p.items) :]
        raw = adapter.postprocess(env, p, mine)
        dec = msgspec.msgpack if env.accept is Encoding.MSGPACK else msgspec.json
        replies.append(dec.decode(raw))
    return replies


def onnx_runtime(cache_dir: Path) -> Any:
    """The ONNX runtime on CPU, or a skip where it is not available."""
    import pytest

    pytest.importorskip("fleetserve.runtimes.onnx", exc_type=ImportError)
    from fleetserve.runtimes import create_runtime

    return create_runtime("onnx", device="cpu", precision="fp32", cache_dir=cache_dir)


def openvino_runtime(cache_dir: Path) -> Any:
    """The OpenVINO runtime on CPU, fp32."""
    from fleetserve.runtimes import create_runtime

    return create_runtime("openvino", device="cpu", precision="fp32", cache_dir=cache_dir)
