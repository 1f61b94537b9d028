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


def save_merged(base: Path, adapter: Path, head: str, out: Path) -> Path:
    """PEFT's ``merge_and_unload`` of ``adapter`` into ``base``, saved as a model of its
    own with the base's other files (tokenizer, chat template, projection heads)."""
    from safetensors.torch import load_file, save_file

    model = peft_model(base, adapter, head).merge_and_unload()
    model.save_pretrained(str(out))
    weights, kept = out / "model.safetensors", load_file(str(base / "model.safetensors"))
    tensors = load_file(str(weights))  # keep what the head class drops (ColBERT's linear)
    extra = {  # not merged under this name or without its prefix ("bert.")
        k: v for k, v in kept.items() if k not in tensors and k.partition(".")[2] not in tensors
    }
    save_file({**extra, **tensors}, str(weights), metadata={"format": "pt"})
    for f in base.iterdir():  # tokenizer, projection heads
        if not (out / f.name).exists():
            if f.is_dir():
                continue
            (out / f.name).write_bytes(f.read_bytes())
    return out


def token_feed(base: Path, texts: list[str]) -> dict[str, Any]:
    """``texts`` tokenized by ``base``'s tokenizer, padded: int64 arrays by input name."""
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(str(base))(texts, padding=True, return_tensors="np")
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def peft_mean(base: Path, adapter: Path | None, texts: list[str]) -> Any:
    """Mean-pooled rows of ``texts`` through PEFT running ``adapter`` alone at fp32 (or
    through the base): what a row with that adapter must come out as."""
    import torch
    from transformers import AutoTokenizer

    model = peft_model(base, adapter) if adapter is not None else load_base(base)
    batch = AutoTokenizer.from_pretrained(str(base))(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()
