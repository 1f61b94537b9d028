"""Read a validated PEFT LoRA directory into the tensors a :class:`LoraBank` takes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

from .shapes import strip_peft

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def scaling_of(config: dict[str, object]) -> float:
    """PEFT's scaling: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA."""
    r = float(config.get("r", 8))  # type: ignore[arg-type]
    alpha = float(config.get("lora_alpha", 8))  # type: ignore[arg-type]
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def read_adapter(path: Path) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float]:
    """(module name -> (A, B), scaling) of the adapter in ``path``; module names are
    PEFT's without ``base_model.model.`` (safetensors only: nothing is unpickled)."""
    config = json.loads((path / CONFIG).read_text())
    flat = load_file(str(path / WEIGHTS))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in flat.items():
        name = strip_peft(key)
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in name:
                module = name.split(marker)[0]
                pairs.setdefault(module, {})[part] = tensor
    tensors = {m: (p["lora_A"], p["lora_B"]) for m, p in pairs.items()}
    return tensors, scaling_of(config)
