"""Typed request bodies, decoded by the worker (never by the gateway)."""

from __future__ import annotations

import msgspec


class EncodeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/encode/{model}``."""

    inputs: str | list[str]
    normalize: bool | None = None  # None: the model spec's default
    output_dtype: str = "float32"
    dimensions: int | None = None
    truncate: bool = True


class EmbeddingsRequest(msgspec.Struct):
    """``POST /v1/embeddings`` (OpenAI-compatible; unknown fields such as ``user`` pass)."""

    input: str | list[str]
    model: str
    encoding_format: str = "float"
    dimensions: int | None = None


class ModelOnly(msgspec.Struct):
    """What the gateway extracts from an OpenAI body: the model name and nothing else."""

    model: str
