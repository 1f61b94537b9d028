"""Image and text embeddings in one vector space: CLIP and SigLIP.

Serves ``/v1/encode/{model}``, whose inputs are images (msgpack bin; base64 or a
``data:`` URL in JSON) and texts, and ``/v1/score/{model}``: a text or image query
against text or image items, by cosine similarity. Images are decoded here, in the
worker, never in the gateway. Each image costs its vision tokens (patches, plus the
class token for CLIP) in the batch former; each text its token count.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

from ..catalog import ModelSpec
from ..runtimes import Head, ModuleRuntime, Runtime
from ..wire import Encoding, Envelope, InvalidInput, Task
from ..wire.codec import TypedDecoder, array_to_wire, dumps
from ..wire.image_requests import ImageEncodeRequest, ImageScoreRequest
from ..wire.values import Array
from . import scoring
from .base import Family, Prepared, rows
from .image_preprocess import (
    ImageConfig,
    ImageError,
    ImageLimits,
    TowerTokenizer,
    available_formats,
    decode_image,
    image_config,
    pixels,
)

_DTYPES = {"float32": np.float32, "float16": np.float16}


ImageRequest = (
    ImageEncodeRequest[bytes]
    | ImageEncodeRequest[str]
    | ImageScoreRequest[bytes]
    | ImageScoreRequest[str]
)
_DECODERS: dict[tuple[Task, Encoding], TypedDecoder[ImageRequest]] = {
    (Task.ENCODE, Encoding.MSGPACK): TypedDecoder(ImageEncodeRequest[bytes]),
    (Task.ENCODE, Encoding.JSON): TypedDecoder(ImageEncodeRequest[str]),
    (Task.SCORE, Encoding.MSGPACK): TypedDecoder(ImageScoreRequest[bytes]),
    (Task.SCORE, Encoding.JSON): TypedDecoder(ImageScoreRequest[str]),
}


@dataclass(frozen=True, slots=True)
class ImageOptions:
    normalize: bool
    output_dtype: str
    images: int
    score: bool = False


# one row for forward: an image's pixel values, or a text's token ids
ImageInput = tuple[Literal["image"], Array] | tuple[Literal["text"], list[int]]


class ImageFamily(Family[ImageInput, ImageOptions, Array]):
    tasks = frozenset({Task.ENCODE, Task.SCORE})

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        if runtime.name != "torch":
            raise ValueError(f"model {spec.id}: the image family needs runtime: torch")
        self.spec = spec
        self.runtime = runtime
        self._module: ModuleRuntime | None = None  # the runtime, once it lends its model
        self.path = path
        o = spec.options
        self.limits = ImageLimits(
            max_bytes=int(o.get("max_image_bytes", 10 * 1024 * 1024)),
            max_pixels=int(o.get("max_image_pixels", 40_000_000)),
            formats=available_formats(o.get("image_formats")),
            exif_transpose=bool(o.get("exif_transpose", True)),
        )
        self.dim = spec.dimensions or 0
        self.image_tokens = 0
        self._cfg: ImageConfig | None = None
        self._tok: TowerTokenizer | None = None

    def load(self) -> None:
        self.runtime.load(self.path, Head.BASE)
        if not isinstance(self.runtime, ModuleRuntime):
            raise ValueError(f"model {self.spec.id}: the image family needs runtime: torch")
        self._module = self.runtime
        config = self._module.model.config
        kind = str(config.model_type)
        if kind not in ("clip", "siglip"):
            raise ValueError(
                f"model {self.spec.id}: the image family serves clip and siglip, not {kind!r}"
            )
        vc, tc = config.vision_config, config.text_config
        self.image_tokens = (vc.image_size // vc.patch_size) ** 2 + (kind == "clip")
        self._cfg = image_config(self.path, kind, int(vc.image_size))
        max_len = min(self.spec.max_seq_len, int(tc.max_position_embeddings))
        self._tok = TowerTokenizer(self.path, kind, max_len, self.spec.options)

    def warmup(self) -> None:
        from PIL import Image

        px = pixels(Image.new("RGB", (64, 48), (127, 64, 200)), self.config)
        ids, _ = self.tokenizer.encode(["warm up"], truncate=True)
        self.dim = int(self.forward([("image", px), ("text", ids[0])])[0].shape[0])

    @property
    def config(self) -> ImageConfig:
        if self._cfg is None:
            raise RuntimeError("adapter is not loaded")
        return self._cfg

    @property
    def tokenizer(self) -> TowerTokenizer:
        if self._tok is None:
            raise RuntimeError("adapter is not loaded")
        return self._tok

    @property
    def module_runtime(self) -> ModuleRuntime:
        """The runtime, as the lender of its loaded model (the two towers run here)."""
        if self._module is None:
            raise RuntimeError("adapter is not loaded")
        return self._module

    def memory_bytes(self) -> int:
        return self.runtime.memory_bytes()

    # -- preprocess -------------------------------------------------------------
    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[ImageInput, ImageOptions]:
        if envelope.task not in self.tasks:
            raise InvalidInput(f"the image family does not serve {envelope.task.value}")
        r = _DECODERS[(envelope.task, envelope.content_type)].decode(body, envelope.content_type)
        if isinstance(r, ImageScoreRequest):
            if not r.items:
                raise InvalidInput("items must not be empty: nothing to score", field="items")
            entries = [("query", r.query), *((f"items[{i}]", x) for i, x in enumerate(r.items))]
            normalize, dtype, score = True, "float32", True
        else:
            inputs = r.inputs if isinstance(r.inputs, list) else [r.inputs]
            if not inputs:
                raise InvalidInput("inputs must not be empty", field="inputs")
            if r.output_dtype not in _DTYPES:
                raise InvalidInput(
                    f"output_dtype must be one of {sorted(_DTYPES)}", field="output_dtype"
                )
            entries = [(f"inputs[{i}]", x) for i, x in enumerate(inputs)]
            normalize = self.spec.normalize if r.normalize is None else r.normalize
            dtype, score = r.output_dtype, False
        items: list[ImageInput | None] = [None] * len(entries)
        lengths = [self.image_tokens] * len(entries)
        texts: list[tuple[int, str, str]] = []
        for k, (field, x) in enumerate(entries):
            text, image = (x, None) if isinstance(x, str) else (x.text, x.image)
            if (text is None) == (image is None):
                raise InvalidInput(f"{field} must have exactly one of image or text", field=field)
            if text is not None:
                if not text:
                    raise InvalidInput(f"{field} is an empty string", field=field)
                texts.append((k, field, text))
            else:
                items[k] = ("image", self._pixels(field, image))
        tokens = (len(entries) - len(texts)) * self.image_tokens
        if texts:
            ids, over = self.tokenizer.encode([t for _, _, t in texts], truncate=r.truncate)
            if over is not None:
                field = texts[over][1]
                raise InvalidInput(
                    f"{field} is longer than the model's limit of {self.tokenizer.max_len} "
                    "tokens and truncate is false",
                    field=field,
                )
            for (k, _, _), seq in zip(texts, ids, strict=True):
                items[k] = ("text", seq)
                lengths[k] = self.tokenizer.cost(seq)
                tokens += len(seq)
        opts = ImageOptions(normalize, dtype, len(entries) - len(texts), score)
        filled = cast(list[ImageInput], items)  # each entry is an image or a text by now
        return Prepared(items=filled, options=opts, tokens=tokens, lengths=lengths)

    def _pixels(self, field: str, image: bytes | str | None) -> Array:
        data = image if isinstance(image, bytes) else self._b64(field, image or "")
        try:
            return pixels(decode_image(data, self.limits), self.config)
        except ImageError as exc:
            raise InvalidInput(f"{field} {exc}", field=field) from None
        except Exception as exc:  # an unusual mode Pillow cannot convert
            raise InvalidInput(f"{field} could not be converted: {exc}", field=field) from None

    def _b64(self, field: str, text: str) -> bytes:
        if text.startswith("data:"):
            head, sep, text = text.partition(",")
            if not sep or not head.endswith(";base64"):
                raise InvalidInput(f"{field} is a data URL that is not base64", field=field)
        if len(text) > (self.limits.max_bytes + 2) // 3 * 4 + 64:
            raise InvalidInput(
                f"{field} is over the limit of {self.limits.max_bytes} bytes", field=field
            )
        try:
            return base64.b64decode("".join(text.split()), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput(f"{field} is not valid base64", field=field) from None

    # -- forward ----------------------------------------------------------------
    def forward(self, items: Sequence[ImageInput]) -> Sequence[Array]:
        import torch

        rt = self.module_runtime
        model = rt.model
        dev = rt.device
        imgs: list[int] = []
        txts: list[int] = []
        images: list[Array] = []
        texts: list[list[int]] = []
        for i, it in enumerate(items):
            if it[0] == "image":
                imgs.append(i)
                images.append(it[1])
            else:
                txts.append(i)
                texts.append(it[1])
        parts: list[tuple[list[int], Any]] = []
        with torch.inference_mode(), rt.autocast():
            if imgs:
                px = torch.from_numpy(np.stack(images))
                feats = model.get_image_features(pixel_values=px.to(dev, dtype=model.dtype))
                parts.append((imgs, feats))
            if txts:
                ids, mask = self.tokenizer.pad(texts)
                kwargs = {"input_ids": torch.from_numpy(ids).to(dev)}
                if self.tokenizer.attention_mask:
                    kwargs["attention_mask"] = torch.from_numpy(mask).to(dev)
                parts.append((txts, model.get_text_features(**kwargs)))
            pooled = [(idx, _pooled(f).float().cpu().numpy()) for idx, f in parts]
        out = np.empty((len(items), pooled[0][1].shape[1]), dtype=np.float32)
        for idx, arr in pooled:
            out[idx] = arr
        return rows(out)

    # -- postprocess ------------------------------------------------------------
    def postprocess(
        self,
        envelope: Envelope,
        prepared: Prepared[ImageInput, ImageOptions],
        outputs: list[Array],
    ) -> bytes:
        o = prepared.options
        emb = np.stack(outputs).astype(np.float32)
        if o.normalize:
            emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        if o.score:
            q = scoring.ScoreQuery(query="", documents=[])
            return scoring.reply(envelope, self.spec.id, q, emb[1:] @ emb[0], prepared.tokens)
        emb = np.ascontiguousarray(emb, dtype=_DTYPES[o.output_dtype])
        body: dict[str, object] = {
            "model": self.spec.id,
            "embeddings": array_to_wire(emb)
            if envelope.accept is Encoding.MSGPACK
            else emb.tolist(),
            "usage": {"tokens": prepared.tokens, "images": o.images},
        }
        return dumps(body, envelope.accept)


def _pooled(out: Any) -> Any:
    """transformers 5 returns the projected features as ``pooler_output``; 4.x a tensor."""
    return getattr(out, "pooler_output", out)
