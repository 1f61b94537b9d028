"""The random BERTs of ``python -m benchmarks fleet trace`` and their catalog.

Built once with transformers (random weights, a tiny WordPiece vocabulary shared by
all) and cached under ``.bench/fleet-models/``; a model directory is complete when its
``done`` marker exists, so an interrupted build resumes where it stopped.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CACHE = Path(".bench/fleet-models")
# (hidden, layers): about 4, 19, 33 and 60 MiB of fp32 weights
SHAPES = [(256, 2), (384, 4), (512, 4), (512, 7)]
WORDS = [
    "the", "a", "of", "to", "and", "in", "is", "was", "for", "on", "with", "as", "by",
    "at", "from", "it", "this", "that", "be", "are", "or", "not", "hello", "world",
    "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "fleet", "model", "serve",
]  # fmt: skip
SENTENCE = "the quick brown fox jumps over the lazy dog"


@dataclass(frozen=True)
class Model:
    id: str
    path: Path
    hidden: int
    layers: int
    bytes: int  # of weights on disk
    pinned: bool
    runtime: str = "torch"


def shapes(n: int, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` shapes: the first (the pinned model) the smallest, the rest the four sizes
    in turn, shuffled so that a model's popularity says nothing of its size."""
    rest = [SHAPES[(i + 1) % len(SHAPES)] for i in range(n - 1)]
    random.Random(seed).shuffle(rest)
    return [SHAPES[0], *rest][:n]


def runtime_shares(n: int, runtimes: Sequence[str], seed: int = 1) -> list[str]:
    """``n`` runtimes, each of ``runtimes`` in turn, shuffled apart from the shapes'
    order (another seed), so that a model's runtime says nothing of its size or rank."""
    out = [runtimes[i % len(runtimes)] for i in range(n)]
    random.Random(seed).shuffle(out)
    return out


def _tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    items = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters]
    items += ["##" + c for c in letters] + WORDS
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(items))}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")


def build(path: Path, seed: int, hidden: int, layers: int) -> int:
    """A random BERT at ``path`` (unless already there); the bytes of its weights."""
    if not (path / "done").exists():
        import torch
        from transformers import BertConfig, BertModel

        shutil.rmtree(path, ignore_errors=True)
        tok = path.parent / "tokenizer"
        if not (tok / "vocab.txt").exists():
            _tokenizer(tok)
        path.mkdir(parents=True)
        for name in ("tokenizer.json", "vocab.txt"):
            shutil.copy(tok / name, path / name)
        torch.manual_seed(seed)
        config = BertConfig(
            vocab_size=len((tok / "vocab.txt").read_text().split()),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=2 * hidden,
            max_position_embeddings=64,
        )
        from transformers.utils import logging

        logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        model: Any = BertModel(config)
        model.eval().save_pretrained(str(path))
        (path / "done").write_text("")
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def spec(model: Model) -> dict[str, Any]:
    return {
        "id": model.id,
        "family": "dense",
        "runtime": model.runtime,
        "sources": [str(model.path.resolve())],
        "pooling": "mean",
        "normalize": True,
        "max_seq_len": 32,
        "dimensions": model.hidden,
        "pinned": model.pinned,
        "budgets": {"cpu": {"max_batch_tokens": 256, "max_batch_size": 8}},
    }


def fleet(
    n: int,
    cache: Path = CACHE,
    catalog: Path | None = None,
    runtimes: Sequence[str] = ("torch",),
) -> tuple[Path, list[Model]]:
    """``n`` models (``fleet/m0`` pinned, on torch), built or found in ``cache``, and a
    catalog of them (``cache/catalog-<n>`` unless given). The others take ``runtimes``
    in a seeded shuffle of equal shares, so that neither popularity nor size says which.
    The bundled pinned models are overridden as unpinned so that only these count
    against the budget."""
    rest = runtime_shares(n - 1, runtimes)
    models = []
    for i, (hidden, layers) in enumerate(shapes(n)):
        path = cache / f"h{hidden}-l{layers}-s{i}"
        size = build(path, i, hidden, layers)
        runtime = "torch" if i == 0 else rest[i - 1]
        models.append(Model(f"fleet/m{i}", path, hidden, layers, size, i == 0, runtime))
    cat = catalog or cache / f"catalog-{n}-{'-'.join(runtimes)}"
    shutil.rmtree(cat, ignore_errors=True)
    cat.mkdir(parents=True)
    for m in models:
        (cat / f"{m.id.replace('/', '__')}.yaml").write_text(yaml.safe_dump(spec(m)))
    unpin_bundled(cat)
    return cat, models


def unpin_bundled(cat: Path) -> None:
    """Copies of the bundled specs that are pinned, unpinned, into ``cat`` (a later
    catalog entry overrides a bundled one of the same id)."""
    from importlib import resources

    for entry in (resources.files("fleetserve.catalog") / "models").iterdir():
        if entry.name.endswith((".yaml", ".yml")):
            d = yaml.safe_load(entry.read_text())
            if d.get("pinned"):
                d["pinned"] = False
                (cat / f"bundled-{entry.name}").write_text(yaml.safe_dump(d))
