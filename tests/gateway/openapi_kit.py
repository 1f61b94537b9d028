"""A real server with one tiny model of each text family, for the OpenAPI contract
tests and the fuzzer: dense, sparse, multi-vector, cross-encoder, NER and a small
generator. Built in a second or two; adapters in memory, no trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetserve.runtimes import Head

from ..conftest import TINY, ServerThread, tiny_settings
from ..tiny_colbert import build_hf_colbert
from ..tiny_extract import build_token_classifier
from ..tiny_generate import build_llama
from ..tiny_onnx import build_head
from ..tiny_rerank import build_cross_encoder
from ..tinymodels import build_bert, write_spec

SPARSE, COLBERT, RERANK, NER, CHAT = (
    "tiny/sparse", "tiny/colbert", "tiny/rerank", "tiny/ner", "tiny/chat",
)  # fmt: skip
MODELS = (TINY, SPARSE, COLBERT, RERANK, NER, CHAT)
GEN_PROFILE = {"cpu": {"precision": "fp32", "max_batch_tokens": 1024, "max_batch_size": 8}}


def build_catalog(root: Path) -> Path:
    cat = root / "catalog"
    write_spec(cat, TINY, build_bert(root / "dense"))
    sparse = build_head(root / "sparse", Head.MASKED_LM)
    write_spec(cat, SPARSE, sparse, family="sparse", pooling="none", normalize=False)
    write_spec(cat, COLBERT, build_hf_colbert(root / "colbert"), family="multivector")
    write_spec(cat, RERANK, build_cross_encoder(root / "rerank"), family="cross_encoder")
    ner = build_token_classifier(root / "ner")
    write_spec(cat, NER, ner, family="ner", pooling="none", max_seq_len=64)
    llama = build_llama(root / "llama", max_positions=64)
    write_spec(cat, CHAT, llama, family="generate", max_seq_len=48, profiles=GEN_PROFILE,
               options={"max_tokens": 4})  # fmt: skip
    return cat


def start(root: Path, **overrides: Any) -> ServerThread:
    cat = build_catalog(root)
    settings = tiny_settings(
        cat,
        models=",".join(MODELS),
        cache_dir=str(root / "cache"),
        tune_dir=str(root / "runs"),
        adapter_store="memory://",
        **overrides,
    )
    return ServerThread(settings).start()


_SHARED: dict[str, tuple[ServerThread, Path]] = {}


def shared(request: pytest.FixtureRequest) -> tuple[ServerThread, Path]:
    """One server for the contract tests and the fuzzer (started once, about 10 s on a
    busy 2-core machine), stopped when the session ends."""
    if "srv" not in _SHARED:
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        root = factory.mktemp("openapi")
        srv = start(root)
        request.config.add_cleanup(srv.stop)
        request.config.add_cleanup(lambda: _SHARED.clear())
        _SHARED["srv"] = (srv, root)
    return _SHARED["srv"]


def plain(obj: Any) -> Any:
    """A decoded msgpack body as the document's JSON Schema sees it: bin as base64."""
    return msgspec.json.decode(msgspec.json.encode(obj))
