"""Models derived for ``python -m benchmarks families`` where no real weights of a family exist:
all-MiniLM-L6-v2's encoder under a fresh head, or a random model of a real model's shape,
so that the compute per item is that of a real small model. Written atomically."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def derive_head(kind: str, num_labels: int) -> Callable[[Path, Path], dict[str, Any]]:
    """MiniLM's encoder with a fresh classification head, saved as a checkpoint."""

    def derive(minilm: Path, out: Path) -> dict[str, Any]:
        if not (out / "config.json").is_file():
            import transformers

            cls = getattr(transformers, f"BertFor{kind}")
            labels = (
                ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
                if kind == "TokenClassification"
                else [f"LABEL_{k}" for k in range(num_labels)]
            )
            model = cls.from_pretrained(
                str(minilm),
                num_labels=len(labels),
                id2label=dict(enumerate(labels)),
                label2id={lab: k for k, lab in enumerate(labels)},
            )
            tmp = out.with_suffix(".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(str(tmp))
            for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
                if (minilm / f).is_file():
                    shutil.copy(minilm / f, tmp / f)
            tmp.rename(out)
        family = "ner" if kind == "TokenClassification" else "cross_encoder"
        return {"family": family, "sources": [str(out)], "max_seq_len": 256}

    return derive


def derive_clip(minilm: Path, out: Path) -> dict[str, Any]:
    """A CLIP with ViT-B/32's vision tower (88M parameters) and random weights, and a
    small text tower on MiniLM's WordPiece vocabulary: the compute of a real CLIP image."""
    if not (out / "config.json").is_file():
        import torch
        from transformers import CLIPConfig, CLIPModel

        vocab = json.loads((minilm / "tokenizer.json").read_text())["model"]["vocab"]
        text = {"vocab_size": len(vocab), "hidden_size": 256, "intermediate_size": 1024,
                "num_hidden_layers": 2, "num_attention_heads": 4,
                "pad_token_id": vocab["[PAD]"], "bos_token_id": vocab["[CLS]"],
                "eos_token_id": vocab["[SEP]"]}  # fmt: skip
        vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                  "num_attention_heads": 12, "image_size": 224, "patch_size": 32}  # fmt: skip
        torch.manual_seed(0)
        model: Any = CLIPModel(
            CLIPConfig(text_config=text, vision_config=vision, projection_dim=512)
        )
        tmp = out.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.eval().save_pretrained(str(tmp))
        shutil.copy(minilm / "tokenizer.json", tmp / "tokenizer.json")
        pre = {"do_resize": True, "size": {"shortest_edge": 224}, "do_center_crop": True,
               "crop_size": {"height": 224, "width": 224}, "resample": 3, "do_rescale": True,
               "rescale_factor": 1 / 255, "do_normalize": True,
               "image_mean": [0.48145466, 0.4578275, 0.40821073],
               "image_std": [0.26862954, 0.26130258, 0.27577711]}  # fmt: skip
        (tmp / "preprocessor_config.json").write_text(json.dumps(pre))
        tmp.rename(out)
    return {"family": "image", "sources": [str(out)], "max_seq_len": 64}


def derive_gliner(minilm: Path, out: Path) -> dict[str, Any]:
    """A GLiNER span model in gliner's own layout: MiniLM as the encoder (plus the three
    prompt tokens), a random 512-d GLiNER head, as gliner_small-v2.1 is shaped."""
    if not (out / "gliner_config.json").is_file():
        import torch
        from tokenizers import Tokenizer
        from transformers import BertModel

        from fleetserve.families.gliner_model import GlinerConfig, GlinerSpanModel

        tok = Tokenizer.from_file(str(minilm / "tokenizer.json"))
        tok.add_special_tokens(["[FLERT]", "<<ENT>>", "<<SEP>>"])
        encoder: Any = BertModel.from_pretrained(str(minilm))
        encoder.resize_token_embeddings(tok.get_vocab_size())
        enc_config = encoder.config.to_dict()
        cfg = {
            "span_mode": "markerV0", "max_width": 12, "hidden_size": 512, "max_len": 384,
            "subtoken_pooling": "first", "num_rnn_layers": 1, "embed_ent_token": True,
            "ent_token": "<<ENT>>", "sep_token": "<<SEP>>", "words_splitter_type": "whitespace",
            "class_token_index": tok.token_to_id("<<ENT>>"), "encoder_config": enc_config,
        }  # fmt: skip
        torch.manual_seed(0)
        model = GlinerSpanModel(GlinerConfig.read_dict(cfg), encoder.config)
        model.encoder.load_state_dict(encoder.state_dict())
        state = {_gliner_key(k): v for k, v in model.state_dict().items()}
        tmp = out.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        (tmp / "gliner_config.json").write_text(json.dumps(cfg))
        tok.save(str(tmp / "tokenizer.json"))
        tmp.rename(out)
    return {"family": "span_ner", "sources": [str(out)], "max_seq_len": 512}


def _gliner_key(key: str) -> str:
    for ours, theirs in (
        ("encoder.", "token_rep_layer.bert_layer.model."),
        ("projection.", "token_rep_layer.projection."),
        ("lstm.", "rnn.lstm."),
        ("prompt_rep.", "prompt_rep_layer."),
    ):
        if key.startswith(ours):
            return theirs + key[len(ours) :]
    return "span_rep_layer.span_rep_layer." + key
