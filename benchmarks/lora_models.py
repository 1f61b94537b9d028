"""Adapters for ``python -m benchmarks lora``: random PEFT LoRAs on the real models."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"


def base_dir(model: str) -> Path:
    """The model's weights on this machine (SmolLM2's GGUF is converted once)."""
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.weights import weights_path
    from fleetserve.settings import Settings

    return weights_path(Catalog.load().get(model), Settings())


def make_adapters(
    model: str,
    out: Path,
    n: int,
    *,
    rank: int,
    targets: Sequence[str],
    causal: bool = False,
) -> list[Path]:
    """``n`` random LoRAs (A and B drawn at random: PEFT's init leaves B at zero)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel, AutoModelForCausalLM

    cls: Any = AutoModelForCausalLM if causal else AutoModel
    path = base_dir(model)
    dirs = []
    for k in range(n):
        torch.manual_seed(k)
        config = LoraConfig(
            r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft = get_peft_model(cls.from_pretrained(str(path)), config)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn_like(p) * 0.02)
        peft.peft_config["default"].base_model_name_or_path = model
        peft.save_pretrained(str(out / f"a{k}"))
        dirs.append(out / f"a{k}")
    return dirs


def upload(url: str, adapter: Path, name: str, base: str) -> dict[str, Any]:
    """``POST /v1/adapters`` as multipart; the adapter's info (its id and hash)."""
    files = {
        "config": ("adapter_config.json", (adapter / "adapter_config.json").read_bytes()),
        "weights": (
            "adapter_model.safetensors",
            (adapter / "adapter_model.safetensors").read_bytes(),
        ),
    }
    r = httpx.post(f"{url}/v1/adapters", data={"name": name, "base": base}, files=files, timeout=60)
    if r.status_code != 201:
        raise RuntimeError(f"upload of {name} failed: {r.status_code} {r.text[:300]}")
    info: dict[str, Any] = r.json()
    return info
