"""GLiNER span models, loaded from a gliner checkpoint without the gliner package.

Covers the uni-encoder span models (``urchade/gliner_small|medium|large|multi-v2.1``
and their fine-tunes): a transformers encoder, first-subtoken word pooling (or last,
mean, max), a bi-LSTM over words, the ``markerV0`` span layer (start and end MLPs,
then an MLP over their concatenation, for spans of up to ``max_width`` words) and the
entity prompt MLP. A span's score for a label is the sigmoid of the dot product of the
two. gliner itself pins an older transformers; this module needs only torch and
transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..catalog.rules import install_hint

try:
    import torch
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    from transformers import AutoConfig, AutoModel, PretrainedConfig
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "GLiNER models need torch and transformers: " + install_hint("torch")
    ) from exc

POOLINGS = ("first", "last", "mean", "max")
# gliner's state-dict prefixes -> this module's
_PREFIXES = (
    ("token_rep_layer.bert_layer.model.", "encoder."),
    ("token_rep_layer.projection.", "projection."),
    ("rnn.lstm.", "lstm."),
    ("span_rep_layer.span_rep_layer.", ""),
    ("prompt_rep_layer.", "prompt_rep."),
)


@dataclass(frozen=True, slots=True)
class GlinerConfig:
    """The parts of ``gliner_config.json`` that inference needs."""

    max_width: int
    hidden_size: int
    max_len: int  # words of text kept per input (longer texts are truncated)
    pooling: str
    rnn_layers: int
    embed_ent_token: bool
    ent_token: str
    sep_token: str
    class_token_index: int
    encoder: dict[str, Any] | None  # the encoder's transformers config, when saved

    @classmethod
    def read(cls, path: Path) -> GlinerConfig:
        d: dict[str, Any] = json.loads((path / "gliner_config.json").read_text())
        try:
            return cls.read_dict(d)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def read_dict(cls, d: dict[str, Any]) -> GlinerConfig:
        unsupported = {
            "span_mode": d.get("span_mode", "markerV0") != "markerV0",
            "labels_encoder": bool(d.get("labels_encoder")),
            "labels_decoder": bool(d.get("labels_decoder")),
            "relations_layer": d.get("relations_layer") is not None,
            "post_fusion_schema": bool(d.get("post_fusion_schema")),
            "fuse_layers": bool(d.get("fuse_layers")),
            "span_encoder_config": d.get("span_encoder_config") is not None,
            "precomputed_prompts_mode": bool(d.get("precomputed_prompts_mode")),
            "words_splitter_type": d.get("words_splitter_type", "whitespace") != "whitespace",
            "subtoken_pooling": d.get("subtoken_pooling", "first") not in POOLINGS,
        }
        bad = [f"{k}={d.get(k)!r}" for k, v in unsupported.items() if v]
        if bad:
            raise ValueError(
                "only uni-encoder markerV0 GLiNER span models are supported; "
                "this checkpoint has " + ", ".join(bad)
            )
        return cls(
            max_width=int(d.get("max_width", 12)),
            hidden_size=int(d.get("hidden_size", 512)),
            max_len=int(d.get("max_len", 384)),
            pooling=str(d.get("subtoken_pooling", "first")),
            rnn_layers=int(d.get("num_rnn_layers", 1)),
            embed_ent_token=bool(d.get("embed_ent_token", True)),
            ent_token=str(d.get("ent_token", "<<ENT>>")),
            sep_token=str(d.get("sep_token", "<<SEP>>")),
            class_token_index=int(d.get("class_token_index", -1)),
            encoder=d.get("encoder_config"),
        )


def _mlp(dim_in: int, dim_out: int) -> nn.Sequential:
    """gliner's projection layer: Linear(in, 4 out), ReLU, Dropout, Linear(4 out, out)."""
    return nn.Sequential(
        nn.Linear(dim_in, dim_out * 4), nn.ReLU(), nn.Dropout(0.0), nn.Linear(dim_out * 4, dim_out)
    )


class GlinerSpanModel(nn.Module):
    """Encoder, word pooling, bi-LSTM, markerV0 spans and label prompts -> span logits."""

    def __init__(self, cfg: GlinerConfig, encoder_config: PretrainedConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = AutoModel.from_config(encoder_config)  # type: ignore[no-untyped-call]
        h = cfg.hidden_size
        self.projection = (
            nn.Linear(encoder_config.hidden_size, h) if encoder_config.hidden_size != h else None
        )
        self.lstm = (
            nn.LSTM(h, h // 2, num_layers=cfg.rnn_layers, bidirectional=True, batch_first=True)
            if cfg.rnn_layers > 0
            else None
        )
        self.project_start = _mlp(h, h)
        self.project_end = _mlp(h, h)
        self.out_project = _mlp(2 * h, h)
        self.prompt_rep = _mlp(h, h)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        attention_mask: torch.Tensor,  # [B, T]
        words_mask: torch.Tensor,  # [B, T]: 1-based word index of the pooled subtokens, else 0
        prompt_pos: torch.Tensor,  # [B, C]: token position of each label prompt
        num_words: list[int],  # words per row, all >= 1
    ) -> torch.Tensor:
        """Span logits ``[B, W, max_width, C]``; span (s, k) covers words s..s+k."""
        tokens = self.encode(input_ids, attention_mask)
        return self.score(tokens, attention_mask, words_mask, prompt_pos, num_words)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The encoder's last hidden state, in float32."""
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0].float()  # type: ignore[no-any-return]

    def score(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        words_mask: torch.Tensor,
        prompt_pos: torch.Tensor,
        num_words: list[int],
    ) -> torch.Tensor:
        """The GLiNER head over encoder states (see ``forward``)."""
        if self.projection is not None:
            tokens = self.projection(tokens)
        rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1)
        prompts = self.prompt_rep(tokens[rows, prompt_pos])  # [B, C, D]
        words = self._pool(tokens, words_mask, attention_mask, max(num_words))
        if self.lstm is not None:
            packed = pack_padded_sequence(words, num_words, batch_first=True, enforce_sorted=False)
            words, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True)
        width, k = words.shape[1], self.cfg.max_width
        arange = torch.arange(max(width, k), device=words.device)
        ends = (arange[:width, None] + arange[None, :k]).clamp(max=width - 1)
        start = self.project_start(words).unsqueeze(2).expand(-1, -1, k, -1)
        end = self.project_end(words)[:, ends]  # [B, W, K, D]; spans past the text are masked later
        spans = self.out_project(torch.cat([start, end], dim=-1).relu())
        return torch.einsum("BLKD,BCD->BLKC", spans, prompts)

    def _pool(
        self, tokens: torch.Tensor, words_mask: torch.Tensor, attention: torch.Tensor, width: int
    ) -> torch.Tensor:
        batch, _, dim = tokens.shape
        if self.cfg.pooling in ("first", "last"):
            out = tokens.new_zeros((batch, width, dim))
            b, t = torch.where(words_mask > 0)
            out[b, words_mask[b, t] - 1] = tokens[b, t]
            return out
        b, t = torch.where((words_mask > 0) & attention.bool())
        flat = b * width + words_mask[b, t] - 1
        out = tokens.new_zeros((batch * width, dim))
        reduce = "mean" if self.cfg.pooling == "mean" else "amax"
        out.scatter_reduce_(
            0, flat.unsqueeze(-1).expand(-1, dim), tokens[b, t], reduce=reduce, include_self=False
        )
        return out.reshape(batch, width, dim)


def load_model(path: Path, cfg: GlinerConfig, encoder_dir: Path | None) -> GlinerSpanModel:
    """Build the module and load ``model.safetensors`` or ``pytorch_model.bin`` into it."""
    state = _read_weights(path)
    enc = cfg.encoder
    if enc is None:
        if encoder_dir is None or not (encoder_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"{path}/gliner_config.json has no encoder_config: set options.encoder in the "
                "model spec to a directory holding the encoder's config.json and tokenizer.json"
            )
        enc = json.loads((encoder_dir / "config.json").read_text())
    enc = dict(enc)
    enc["vocab_size"] = int(state["encoder.embeddings.word_embeddings.weight"].shape[0])
    encoder_config = AutoConfig.for_model(**enc)
    model = GlinerSpanModel(cfg, encoder_config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("encoder.pooler.")]
    unexpected = [k for k in unexpected if not k.startswith("encoder.pooler.")]
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not match a GLiNER span model "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    return model.eval()


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        raw = load_file(str(path / "model.safetensors"))
    elif (path / "pytorch_model.bin").is_file():
        raw = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{path} has neither model.safetensors nor pytorch_model.bin")
    out: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        for old, new in _PREFIXES:
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        else:
            key = "unknown." + key
        out[key] = value
    return out
