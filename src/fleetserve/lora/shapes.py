"""A base model's Linear shapes, and PEFT's module names matched to the base's.

:func:`linear_shapes` reads only the safetensors headers of a weights directory
(sharded or not): every 2-D ``*.weight`` tensor that is not an embedding is taken as a
Linear layer's ``(out_features, in_features)``. :func:`match_modules` maps the module
names in an adapter (``base_model.model.encoder.layer.0.attention.self.query``) to the
base's, which may carry or lack a prefix such as ``bert.`` or ``model.``: one name must
be a dotted suffix of the other, and the longest such match must be unique. It is pure
and cheap, so the torch layer calls it too, with its ``nn.Linear`` names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from ..wire import InvalidInput
from .safetensors_header import read_header

PEFT_PREFIX = "base_model.model."
# the last part of an embedding's name (PEFT wraps these in its Embedding layer, which
# the mixed-adapter layer does not run)
EMBEDDING_NAMES = frozenset({"wte", "wpe", "shared", "embed_tokens", "embed_positions"})


def is_embedding(module: str) -> bool:
    """Whether ``module`` names an embedding table rather than a Linear layer."""
    last = module.rsplit(".", 1)[-1]
    return last in EMBEDDING_NAMES or "embedding" in last or last.startswith("embed_")


def linear_shapes(weights_dir: Path) -> dict[str, tuple[int, int]]:
    """Module name -> ``(out_features, in_features)`` of the base at ``weights_dir``,
    from its safetensors headers; an ``InvalidInput`` if it has no safetensors files."""
    files = sorted(Path(weights_dir).glob("*.safetensors"))
    if not files:
        raise InvalidInput(
            f"the base model's weights in {weights_dir} are not safetensors, so its layer "
            "shapes cannot be read safely; adapters need a safetensors base",
            field="base",
        )
    shapes: dict[str, tuple[int, int]] = {}
    for f in files:
        for name, t in read_header(f).tensors.items():
            if len(t.shape) == 2 and name.endswith(".weight"):
                module = name[: -len(".weight")]
                if not is_embedding(module):
                    shapes[module] = (t.shape[0], t.shape[1])
    return shapes


def strip_peft(name: str) -> str:
    """``base_model.model.x.y`` -> ``x.y``."""
    return name.removeprefix(PEFT_PREFIX)


def _suffix_match(a: str, b: str) -> int:
    """How well ``a`` and ``b`` match: twice the dotted parts they share when one is a
    dotted suffix of the other, one more when they are equal (0: neither is)."""
    if a == b:
        return 2 * (a.count(".") + 1) + 1
    if b.endswith("." + a) or a.endswith("." + b):
        return 2 * (min(a.count("."), b.count(".")) + 1)
    return 0


def match_modules(adapter_modules: Iterable[str], base_modules: Iterable[str]) -> dict[str, str]:
    """Adapter module name (as given) -> base module name; an ``InvalidInput`` naming
    the module that matches none, or several equally well, or one already taken."""
    by_last: dict[str, list[str]] = {}
    for b in base_modules:
        by_last.setdefault(b.rsplit(".", 1)[-1], []).append(b)
    out: dict[str, str] = {}
    taken: dict[str, str] = {}
    for given in adapter_modules:
        a = strip_peft(given)
        same_last = by_last.get(a.rsplit(".", 1)[-1], ())
        scored = [(n, b) for b in same_last if (n := _suffix_match(a, b))]
        if not scored:
            raise InvalidInput(
                f"target module {a!r} is not a Linear layer of the base model", field="weights"
            )
        best = max(n for n, _ in scored)
        winners = sorted(b for n, b in scored if n == best)
        if len(winners) > 1:
            raise InvalidInput(
                f"target module {a!r} is ambiguous in the base model: it could be "
                + " or ".join(repr(w) for w in winners[:3]),
                field="weights",
            )
        base = winners[0]
        if base in taken:
            raise InvalidInput(
                f"target modules {taken[base]!r} and {a!r} are the same base layer {base!r}",
                field="weights",
            )
        taken[base] = a
        out[given] = base
    return out


def check_shapes(
    module: str, a: tuple[int, ...], b: tuple[int, ...], base: Mapping[str, tuple[int, int]],
    base_name: str, rank: int,
) -> None:  # fmt: skip
    """lora_A must be ``[r, in]`` and lora_B ``[out, r]`` for the base's ``(out, in)``."""
    out_f, in_f = base[base_name]
    if a != (rank, in_f) or b != (out_f, rank):
        raise InvalidInput(
            f"module {module!r}: lora_A is {list(a)} and lora_B {list(b)}, but the base layer "
            f"{base_name!r} is {out_f}x{in_f} (out x in) at rank {rank}, so they must be "
            f"{[rank, in_f]} and {[out_f, rank]}",
            field="weights",
        )
