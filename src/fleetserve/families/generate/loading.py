"""Loading a causal LM, its tokenizer and its end-of-sequence tokens from a directory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...runtimes import Runtime
from ...runtimes.checked_load import load_checked

if TYPE_CHECKING:
    from tokenizers import Tokenizer

from ...catalog.rules import install_hint

try:
    import torch
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the generation family needs torch and transformers: " + install_hint("torch,generate")
    ) from exc

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_tokenizer(path: Path) -> transformers.PreTrainedTokenizerBase:
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{path}: the generation family needs a fast tokenizer (tokenizer.json)")
    return tok


def own_copy(tokenizer: transformers.PreTrainedTokenizerBase) -> Tokenizer:
    """An independent ``tokenizers.Tokenizer`` with the same vocabulary and decoder."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())


def load_config(path: Path) -> object:
    """The model config, or None where the directory holds a tokenizer only (external)."""
    if not (path / "config.json").is_file():
        return None
    return transformers.AutoConfig.from_pretrained(str(path))


def load_causal_lm(path: Path, runtime: Runtime) -> Any:
    """The model on the runtime's device: fp16 weights for fp16; bf16 weights on CUDA,
    fp32 weights under bf16 autocast on CPU (``runtime.autocast``); else fp32."""
    if runtime.name != "torch":
        raise ValueError(
            f"the generation family runs on runtime torch or external, not {runtime.name!r}"
        )
    precision = runtime.precision
    if precision not in _DTYPES:
        raise ValueError(f"generation precision must be one of {sorted(_DTYPES)}")
    device = str(runtime.device)
    cast = precision == "fp16" or (precision == "bf16" and device.startswith("cuda"))
    dtype = _DTYPES[precision] if cast else torch.float32
    model: Any = load_checked(
        transformers.AutoModelForCausalLM, path, "causal-LM head (generate)", dtype=dtype
    )
    return model.to(device).eval()


def eos_ids(
    path: Path, tokenizer: transformers.PreTrainedTokenizerBase, config: object
) -> list[int]:
    """Every token that ends a sequence: the generation config's, the config's and the
    tokenizer's end-of-sequence ids."""
    found: list[int] = []
    sources: list[object] = [getattr(config, "eos_token_id", None), tokenizer.eos_token_id]
    if (path / "generation_config.json").is_file():
        gen = transformers.GenerationConfig.from_pretrained(str(path))
        sources.insert(0, gen.eos_token_id)
    for value in sources:
        for v in value if isinstance(value, list | tuple) else [value]:
            if isinstance(v, int) and v not in found:
                found.append(v)
    return found
