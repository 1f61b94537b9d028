"""Image and text preprocessing for CLIP-style encoders, with Pillow and numpy only.

Images are decoded from bytes under size limits, made RGB (transparency over white),
resized (CLIP: shortest side then a center crop; SigLIP: straight to a square), rescaled
and normalized, as the model's ``preprocessor_config.json`` says. This matches the
transformers image processors without needing torchvision.
"""

from __future__ import annotations

import io
import json
import re
import string
from dataclasses import dataclass
from math import ceil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..wire.values import Array

if TYPE_CHECKING:
    from tokenizers import Tokenizer

try:
    from PIL import Image, ImageOps, UnidentifiedImageError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the image family needs Pillow: install the extra: pip install 'fleetserve[image]'"
    ) from exc

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)
# Formats Pillow may open. EPS and friends stay out: Pillow hands EPS to Ghostscript.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "AVIF")  # JPEG includes MPO
_PUNCT = str.maketrans("", "", string.punctuation)


class ImageError(ValueError):
    """An image that cannot be used; the message says why (``is ...``)."""


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_bytes: int = 10 * 1024 * 1024
    max_pixels: int = 40_000_000
    formats: tuple[str, ...] = FORMATS
    exif_transpose: bool = True


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """What ``preprocessor_config.json`` asks for. Sizes are (height, width)."""

    shortest_edge: int | None = None  # resize the short side to this, keep the aspect
    size: tuple[int, int] | None = None  # else resize to exactly this
    crop: tuple[int, int] | None = None  # then center-crop to this
    resample: int = 3  # PIL.Image.Resampling.BICUBIC
    rescale: float | None = 1 / 255
    mean: tuple[float, ...] | None = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD


def available_formats(wanted: str | list[str] | None) -> tuple[str, ...]:
    """The wanted formats (default :data:`FORMATS`) that this Pillow can open.

    A format named in the spec that Pillow lacks is an error; a missing default
    (AVIF on an older Pillow) is skipped."""
    Image.init()
    if isinstance(wanted, str):
        wanted = wanted.split(",")
    names = tuple(f.strip().upper() for f in (wanted or FORMATS))
    missing = [f for f in names if f not in Image.OPEN]
    if missing and wanted:
        raise ValueError(f"Pillow cannot open image formats {missing}")
    return tuple(f for f in names if f in Image.OPEN)


def _hw(v: Any) -> tuple[int, int]:
    if isinstance(v, dict):
        return int(v["height"]), int(v["width"])
    return int(v), int(v)


def image_config(path: Path, model_type: str, image_size: int) -> ImageConfig:
    """Read ``preprocessor_config.json`` (old and new forms); defaults by model type."""
    f = path / "preprocessor_config.json"
    d: dict[str, Any] = json.loads(f.read_text()) if f.is_file() else {}
    clip = model_type != "siglip"
    crop_on = bool(d.get("do_center_crop", clip if not d else "crop_size" in d))
    size = d.get("size", image_size)
    shortest: int | None = None
    exact: tuple[int, int] | None = None
    if d.get("do_resize", True):
        if isinstance(size, dict) and "shortest_edge" in size:
            shortest = int(size["shortest_edge"])
        elif isinstance(size, int) and crop_on:
            shortest = size
        else:
            exact = _hw(size)
    mean = d.get("image_mean", CLIP_MEAN if clip else HALF)
    std = d.get("image_std", CLIP_STD if clip else HALF)
    return ImageConfig(
        shortest_edge=shortest,
        size=exact,
        crop=_hw(d.get("crop_size", image_size)) if crop_on else None,
        resample=int(d.get("resample", 3)),
        rescale=float(d.get("rescale_factor", 1 / 255)) if d.get("do_rescale", True) else None,
        mean=tuple(float(x) for x in mean) if d.get("do_normalize", True) else None,
        std=tuple(float(x) for x in std),
    )


def decode_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """Open and fully decode an image, or raise :class:`ImageError` saying why."""
    if not data:
        raise ImageError("is empty")
    if len(data) > limits.max_bytes:
        raise ImageError(f"is {len(data)} bytes, over the limit of {limits.max_bytes} bytes")
    try:
        im: Image.Image = Image.open(io.BytesIO(data), formats=list(limits.formats))
    except Image.DecompressionBombError:
        raise ImageError(f"has more than {limits.max_pixels} pixels") from None
    except UnidentifiedImageError:
        fmts = ", ".join(limits.formats)
        raise ImageError(f"is not an image in a supported format ({fmts})") from None
    except Exception as exc:  # Pillow's plugins raise many kinds
        raise ImageError(f"could not be decoded: {exc}") from None
    w, h = im.size
    if w * h > limits.max_pixels:
        raise ImageError(f"has {w}x{h} pixels, over the limit of {limits.max_pixels} pixels")
    if w < 1 or h < 1:
        raise ImageError("has no pixels")
    try:
        im.load()
        if limits.exif_transpose:
            im = ImageOps.exif_transpose(im)
    except Exception as exc:  # truncated or corrupt data shows only when decoding
        raise ImageError(f"could not be decoded: {exc}") from None
    return im


def to_rgb(im: Image.Image) -> Image.Image:
    """RGB, with any transparency composited over white (as transformers does)."""
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im.convert("RGB")


def resize_shape(height: int, width: int, cfg: ImageConfig) -> tuple[int, int]:
    """The (height, width) an image is resized to before cropping."""
    if cfg.shortest_edge is not None:
        s = cfg.shortest_edge
        if width <= height:
            return int(s * height / width), s
        return s, int(s * width / height)
    if cfg.size is not None:
        return cfg.size
    return height, width


def center_crop(arr: Array, crop: tuple[int, int]) -> Array:
    """Center-crop an (H, W, C) array, padding with zeros when it is smaller."""
    h, w = arr.shape[:2]
    ch, cw = crop
    top, left = (h - ch) // 2, (w - cw) // 2
    if top >= 0 and left >= 0:
        return arr[top : top + ch, left : left + cw]
    nh, nw = max(ch, h), max(cw, w)
    out = np.zeros((nh, nw, *arr.shape[2:]), dtype=arr.dtype)
    tp, lp = ceil((nh - h) / 2), ceil((nw - w) / 2)
    out[tp : tp + h, lp : lp + w] = arr
    top, left = top + tp, left + lp
    return out[max(0, top) : min(nh, top + ch), max(0, left) : min(nw, left + cw)]


def pixels(im: Image.Image, cfg: ImageConfig) -> Array:
    """A decoded image as the model's float32 (3, H, W) pixel values."""
    rgb = to_rgb(im)
    h, w = resize_shape(rgb.height, rgb.width, cfg)
    if (h, w) != (rgb.height, rgb.width):
        rgb = rgb.resize((w, h), resample=Image.Resampling(cfg.resample))
    arr: Array = np.asarray(rgb)
    if cfg.crop is not None:
        arr = center_crop(arr, cfg.crop)
    out = arr.astype(np.float64)
    if cfg.rescale is not None:
        out = out * cfg.rescale
    out = out.astype(np.float32)
    if cfg.mean is not None:
        out = (out - np.asarray(cfg.mean, np.float32)) / np.asarray(cfg.std, np.float32)
    return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.float32)


def canonicalize(text: str) -> str:
    """SigLIP's text canonicalization: lowercase, no punctuation, single spaces."""
    return re.sub(r"\s+", " ", text.lower().translate(_PUNCT)).strip()


def pad_token(path: Path, tokenizer: Tokenizer, name: str | None) -> int:
    """The pad id: the spec's ``pad_token``, the tokenizer's padding, its config's
    ``pad_token``, else a usual pad name, else 0."""
    names: list[str] = [name] if name else []
    if not names and tokenizer.padding:
        return int(tokenizer.padding["pad_id"])
    cfg = path / "tokenizer_config.json"
    if not names and cfg.is_file():
        tok = json.loads(cfg.read_text()).get("pad_token")
        tok = tok.get("content") if isinstance(tok, dict) else tok
        names += [tok] if isinstance(tok, str) else []
    for n in [*names, "[PAD]", "<pad>", "<|endoftext|>"]:
        pid = tokenizer.token_to_id(n)
        if pid is not None:
            return int(pid)
    if name:
        raise ValueError(f"pad_token {name!r} is not in the tokenizer's vocabulary")
    return 0


class TowerTokenizer:
    """The text tower's tokenizer. CLIP pads to the longest text in a batch and masks;
    SigLIP pads every text to ``max_len`` with no mask and canonicalizes, as it was
    trained. Spec options ``text_pad_to_max_length``, ``text_attention_mask``,
    ``text_canonicalize`` and ``pad_token`` override."""

    def __init__(self, path: Path, kind: str, max_len: int, options: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing: fleetserve needs a fast tokenizer")
        self._tok = Tokenizer.from_file(str(file))
        siglip = kind == "siglip"
        self.pad_id = pad_token(path, self._tok, options.get("pad_token"))
        self._tok.no_padding()
        self._tok.enable_truncation(max_length=max_len)
        self.max_len = max_len
        self.pad_to_max = bool(options.get("text_pad_to_max_length", siglip))
        self.attention_mask = bool(options.get("text_attention_mask", not siglip))
        self.canonicalize = bool(options.get("text_canonicalize", siglip))

    def encode(self, texts: list[str], *, truncate: bool) -> tuple[list[list[int]], int | None]:
        """Token ids per text, and the index of the first over-long text when not truncating."""
        if self.canonicalize:
            texts = [canonicalize(t) for t in texts]
        encs = self._tok.encode_batch(texts)
        if not truncate:
            for i, e in enumerate(encs):
                if e.overflowing:
                    return [], i
        return [e.ids for e in encs], None

    def cost(self, ids: list[int]) -> int:
        """Tokens the text tower runs for this text."""
        return self.max_len if self.pad_to_max else len(ids)

    def pad(self, seqs: list[list[int]]) -> tuple[Array, Array]:
        """``input_ids`` and ``attention_mask`` (int64), right-padded."""
        width = self.max_len if self.pad_to_max else max(len(s) for s in seqs)
        ids = np.full((len(seqs), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
            mask[i, : len(s)] = 1
        return ids, mask
