"""PEFT LoRA adapters made in the tests, on the tiny (or real) models they build.

``make_lora`` saves an adapter the way PEFT does (``adapter_config.json`` plus
``adapter_model.safetensors``), with random A and B (PEFT's default init leaves B at
zero, which would make every adapter equal the base), and ``peft_model`` loads the
same adapter into PEFT, the reference the mixed batches are compared against.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BERT_TARGETS = ("query", "value")
LLAMA_TARGETS = ("q_proj", "v_proj")


def load_base(base: Path, head: str = "base", dtype: Any = None) -> Any:
    import torch
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    cls = {
        "base": AutoModel,
        "causal_lm": AutoModelForCausalLM,
        "masked_lm": AutoModelForMaskedLM,
        "sequence_classification": AutoModelForSequenceClassification,
        "token_classification": AutoModelForTokenClassification,
    }[head]
    return cls.from_pretrained(str(base), dtype=dtype or torch.float32).eval()


def make_lora(
    base: Path,
    out: Path,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = BERT_TARGETS,
    seed: int = 0,
    head: str = "base",
    scale: float = 0.05,
    base_name: str | None = None,
    use_rslora: bool = False,
) -> Path:
    """A random LoRA on the model at ``base``, saved to ``out`` (returned).

    ``base_name`` goes into ``base_model_name_or_path`` (default: the path)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        init_lora_weights=False,
        use_rslora=use_rslora,
    )
    with warnings.catch_warnings():  # PEFT calls a transformers API deprecated in v5
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(load_base(base, head), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * scale)
    model.peft_config["default"].base_model_name_or_path = base_name or str(base)
    with warnings.catch_warnings():  # a name that is no path: PEFT looks it up online
        warnings.simplefilter("ignore")
        model.save_pretrained(str(out))
    return out


def peft_model(base: Path, adapter: Path, head: str = "base") -> Any:
    """PEFT running ``adapter`` alone on the base at fp32 (the reference)."""
    from peft import PeftModel

    with warnings.catch_warnings():  # PEFT calls a transformers API deprecated in v5
        warnings.simplefilter("ignore", FutureWarning)
        return PeftModel.from_pretrained(load_base(base, head), str(adapter)).eval()
