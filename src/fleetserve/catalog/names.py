"""The names a spec may give its family and its runtime.

The catalog checks specs against them; `families/` and `runtimes/` sit above the
catalog (they read specs) and key their tables by the same names, so the names live
here, below all three. A test checks `families.FAMILIES` lists these families.
"""

from __future__ import annotations

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

__all__ = ["FAMILY_NAMES", "RUNTIMES"]
