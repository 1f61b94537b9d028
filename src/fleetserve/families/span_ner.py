"""GLiNER zero-shot span NER: entities for labels given per request.

Serves ``/v1/extract/{model}``. Each request names its own ``labels``; items from
requests with different label sets share one forward pass (label prompts are padded
per row and masked in decoding). The checkpoint is gliner's own layout
(``gliner_config.json``, ``model.safetensors`` or ``pytorch_model.bin``, and the
tokenizer), loaded by :mod:`.gliner_model` without the gliner package, which pins an
older transformers. Texts are cut to the checkpoint's ``max_len`` words and to the
model's token limit; entities come only from the words kept.

Spec options: ``threshold`` (default 0.5), ``encoder`` (a directory or ``hf:`` source
with the encoder's ``config.json`` and tokenizer, for checkpoints that ship neither).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..catalog.rules import install_hint

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("GLiNER models need torch: " + install_hint("torch")) from exc

from ..catalog import ModelSpec
from ..catalog.sources import resolve
from ..runtimes import Runtime
from ..wire import Envelope, InvalidInput, Task
from ..wire.codec import dumps
from ..wire.values import Array
from .base import Family, Prepared
from .extract import fast_tokenizer, parse_extract
from .gliner_decode import PromptTokenizer, SpanItem, candidates, greedy, split_words
from .gliner_model import GlinerConfig, GlinerSpanModel, load_model

Spans = tuple[Array, Array]  # (start word, width, label) per span above the threshold, scores
_EMPTY: Spans = (np.zeros((0, 3), dtype=np.int64), np.zeros(0, dtype=np.float32))


@dataclass(frozen=True, slots=True)
class _Options:
    labels: list[str]
    flat_ner: bool
    multi_label: bool
    texts: list[str]
    starts: list[list[int]]  # character offsets of each text's words
    ends: list[list[int]]


class SpanNerFamily(Family[SpanItem, _Options, Spans]):
    tasks = frozenset({Task.EXTRACT})

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        self.threshold = float(spec.options.get("threshold", 0.5))
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"model {spec.id}: options.threshold must be in (0, 1)")
        self._model: GlinerSpanModel | None = None
        self._tok: PromptTokenizer | None = None
        self.cfg: GlinerConfig | None = None
        self.pad_id = 0

    # -- loading ----------------------------------------------------------------
    def load(self) -> None:
        """Builds its own module (the runtime only lends device and precision)."""
        if self.runtime.name != "torch":
            raise ValueError(f"model {self.spec.id}: span_ner runs on the torch runtime only")
        cfg = GlinerConfig.read(self.path)
        own_tok = any(
            (self.path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")
        )
        # the encoder's own files, only for checkpoints that lack its config or tokenizer
        encoder_dir = None if cfg.encoder is not None and own_tok else self._encoder_dir()
        model = load_model(self.path, cfg, encoder_dir)
        tok_dir = self.path if own_tok else encoder_dir
        if tok_dir is None:
            raise FileNotFoundError(
                f"{self.path} has no tokenizer: set options.encoder in the model spec"
            )
        tok, self.pad_id = fast_tokenizer(tok_dir)
        limit = int(getattr(model.encoder.config, "max_position_embeddings", 0) or 0)
        prompts = PromptTokenizer(
            tok,
            ent_token=cfg.ent_token,
            sep_token=cfg.sep_token,
            pooling=cfg.pooling,
            embed_ent_token=cfg.embed_ent_token,
            max_words=cfg.max_len,
            max_tokens=min(self.spec.max_seq_len, limit) if limit > 0 else self.spec.max_seq_len,
        )
        rows = model.encoder.get_input_embeddings().num_embeddings
        if 0 <= cfg.class_token_index != prompts.ent_id or prompts.vocab_size > rows:
            raise ValueError(
                f"model {self.spec.id}: the tokenizer does not match the weights "
                f"({cfg.ent_token} is {prompts.ent_id}, config says {cfg.class_token_index}; "
                f"{prompts.vocab_size} tokens for {rows} embeddings)"
            )
        device, precision = str(self.runtime.device), str(self.runtime.precision)
        if precision == "fp16" or (precision == "bf16" and device.startswith("cuda")):
            model.encoder.to(torch.float16 if precision == "fp16" else torch.bfloat16)
        self._model, self._tok, self.cfg = model.to(device), prompts, cfg

    def _encoder_dir(self) -> Path | None:
        """``options.encoder``: a path, or ``hf:org/name`` in the Hugging Face cache that
        holds this checkpoint."""
        src = self.spec.options.get("encoder")
        if not src:
            return None
        parts = self.path.parts
        cache = self.path.parents[2] if len(parts) > 3 and parts[-2] == "snapshots" else Path("/")
        return resolve(f"{self.spec.id} encoder", (str(src),), cache)

    def warmup(self) -> None:
        self.forward(self.tokenizer.encode(["thing"], [["warm", "up"]], self.threshold))

    @property
    def model(self) -> GlinerSpanModel:
        if self._model is None:
            raise RuntimeError("adapter is not loaded")
        return self._model

    @property
    def tokenizer(self) -> PromptTokenizer:
        if self._tok is None:
            raise RuntimeError("adapter is not loaded")
        return self._tok

    def memory_bytes(self) -> int:
        if self._model is None:
            return 0
        return int(sum(p.numel() * p.element_size() for p in self._model.parameters()))

    # -- preprocess -------------------------------------------------------------
    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[SpanItem, _Options]:
        req = parse_extract(envelope, body)
        texts: list[str] = list(req.inputs)
        if not req.labels:
            raise InvalidInput("labels is required: the entity types to find", field="labels")
        tok = self.tokenizer
        for i, label in enumerate(req.labels):
            if not label.strip() or tok.ent_token in label or tok.sep_token in label:
                raise InvalidInput(
                    f"labels[{i}] must be non-empty text without {tok.ent_token} or "
                    f"{tok.sep_token}",
                    field=f"labels[{i}]",
                )
        labels = list(dict.fromkeys(req.labels))
        threshold = self.threshold if req.threshold is None else req.threshold
        if not 0.0 < threshold < 1.0:
            raise InvalidInput("threshold must be between 0 and 1, exclusive", field="threshold")
        split = [split_words(t) for t in texts]
        try:
            items = tok.encode(labels, [w for w, _, _ in split], threshold)
        except ValueError as exc:
            raise InvalidInput(f"labels: {exc}", field="labels") from None
        opts = _Options(
            labels,
            req.flat_ner,
            req.multi_label,
            texts,
            [s for _, s, _ in split],
            [e for *_, e in split],
        )
        return Prepared(
            items=items,
            options=opts,
            tokens=sum(len(it.ids) for it in items),
            lengths=[len(it.ids) for it in items],
        )

    # -- forward ----------------------------------------------------------------
    def forward(self, items: Sequence[SpanItem]) -> list[Spans]:
        """Per item: the (start word, width, label) index and score of every span above
        its threshold; the greedy choice among them is made in postprocess."""
        out: list[Spans] = [_EMPTY] * len(items)
        rows = [i for i, it in enumerate(items) if it.num_words > 0]
        if not rows:
            return out
        live: list[SpanItem] = [items[i] for i in rows]
        width = max(len(it.ids) for it in live)
        n_labels = [len(it.prompt_pos) for it in live]
        ids = np.full((len(live), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(live), width), dtype=np.int64)
        words = np.zeros((len(live), width), dtype=np.int64)
        prompts = np.zeros((len(live), max(n_labels)), dtype=np.int64)
        for r, it in enumerate(live):
            n = len(it.ids)
            ids[r, :n], mask[r, :n], words[r, :n] = it.ids, 1, it.words_mask
            prompts[r, : len(it.prompt_pos)] = it.prompt_pos
        dev = str(self.runtime.device)

        def t(a: Array) -> torch.Tensor:
            return torch.from_numpy(a).to(dev, non_blocking=True)

        with torch.inference_mode():
            with self._autocast():  # the encoder only: the GLiNER head runs in float32
                tokens = self.model.encode(t(ids), t(mask))
            logits = self.model.score(
                tokens, t(mask), t(words), t(prompts), [it.num_words for it in live]
            )
            found = candidates(torch.sigmoid(logits), live, n_labels)
        for r, i in enumerate(rows):
            out[i] = found[r]
        return out

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.runtime.precision == "bf16" and not str(self.runtime.device).startswith("cuda"):
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- postprocess ------------------------------------------------------------
    def postprocess(
        self, envelope: Envelope, prepared: Prepared[SpanItem, _Options], outputs: list[Spans]
    ) -> bytes:
        o = prepared.options
        results = []
        for text, starts, ends, (idx, scores) in zip(
            o.texts, o.starts, o.ends, outputs, strict=True
        ):
            spans = greedy(idx, scores, flat=o.flat_ner, multi_label=o.multi_label)
            results.append(
                [
                    {
                        "start": starts[s],
                        "end": ends[e],
                        "text": text[starts[s] : ends[e]],
                        "label": o.labels[c],
                        "score": score,
                    }
                    for s, e, c, score in spans
                ]
            )
        body = {"model": self.spec.id, "results": results, "usage": {"tokens": prepared.tokens}}
        return dumps(body, envelope.accept)
