"""Tiny random CLIP and SigLIP models (vision and text towers), built in milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

from .tinymodels import build_tokenizer

TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
TOWER["num_attention_heads"] = 2
VISION = {**TOWER, "image_size": 32, "patch_size": 8}
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def _vocab(path: Path) -> dict[str, int]:
    build_tokenizer(path)
    return {t: i for i, t in enumerate((path / "vocab.txt").read_text().split())}


def build_clip(path: Path, *, seed: int = 0) -> Path:
    """A CLIPModel: 32x32 images in 8x8 patches (16 + 1 vision tokens), 24-d projections.

    Images are resized to a short side of 40, then center-cropped to 32."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    vocab = _vocab(path)
    text = {**TOWER, "vocab_size": len(vocab), "max_position_embeddings": 32}
    text |= {"pad_token_id": vocab["[PAD]"], "bos_token_id": vocab["[CLS]"]}
    text["eos_token_id"] = vocab["[SEP]"]  # pooled at the first [SEP]
    torch.manual_seed(seed)
    config = CLIPConfig(text_config=text, vision_config=VISION, projection_dim=24)
    CLIPModel(config).eval().save_pretrained(str(path))
    pre = {
        "do_resize": True,
        "size": {"shortest_edge": 40},
        "do_center_crop": True,
        "crop_size": {"height": 32, "width": 32},
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "do_convert_rgb": True,
        "image_processor_type": "CLIPImageProcessor",
    }
    (path / "preprocessor_config.json").write_text(json.dumps(pre))
    return path


def build_siglip(path: Path, *, seed: int = 0) -> Path:
    """A SiglipModel: 32x32 images in 8x8 patches (16 vision tokens), texts padded to 16."""
    import torch
    from transformers import SiglipConfig, SiglipModel

    vocab = _vocab(path)
    text = {**TOWER, "vocab_size": len(vocab), "max_position_embeddings": 16}
    text["pad_token_id"] = vocab["[PAD]"]
    torch.manual_seed(seed)
    config = SiglipConfig(text_config=text, vision_config=VISION)
    SiglipModel(config).eval().save_pretrained(str(path))
    pre = {
        "do_resize": True,
        "size": {"height": 32, "width": 32},
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "SiglipImageProcessor",
    }
    (path / "preprocessor_config.json").write_text(json.dumps(pre))
    (path / "tokenizer_config.json").write_text(json.dumps({"pad_token": "[PAD]"}))
    return path
