"""The names a spec may give its family and its runtime.

The catalog checks specs against them; `families/` and `runtimes/` sit above the
catalog (they read specs) and key their tables by the same names, so the names live
here, below all three. A test checks `families.FAMILIES` lists these families.
"""

from __future__ import annotations

import re

FAMILY_NAMES = (
    "dense",
    "sparse",
    "multivector",
    "cross_encoder",
    "ner",
    "span_ner",
    "zero_shot",
    "image",
    "generate",
)
RUNTIMES = ("torch", "torch_compile", "onnx", "openvino", "external")


def id_for_source(source: str) -> str:
    """The id of a model added by its source alone (``fleetserve add``, ``POST
    /v1/models``): ``hf:org/name`` -> ``org/name``; a directory or an ``s3://`` prefix
    -> its last part, with what an id may not hold made ``-``."""
    if source.startswith("hf:"):
        parts = source[len("hf:") :].strip("/").split("/")[-2:]
    else:
        parts = source.rstrip("/").rsplit("/", 1)[-1:]
    return "/".join(re.sub(r"[^A-Za-z0-9._-]+", "-", p).strip("-") or "model" for p in parts)


__all__ = ["FAMILY_NAMES", "RUNTIMES", "id_for_source"]
