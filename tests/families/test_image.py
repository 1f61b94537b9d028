"""The image family on tiny random CLIP and SigLIP models, against transformers."""

from __future__ import annotations

import base64
import io
import json
import time
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from PIL import Image

from fleetserve.catalog import ModelSpec
from fleetserve.families.image import ImageFamily
from fleetserve.runtimes import create_runtime
from fleetserve.wire import Encoding, Envelope, InvalidInput, Task
from fleetserve.wire.codec import array_from_wire

from ..tiny_image import build_clip, build_siglip
from .worker_like import run_like_worker

KINDS = ("clip", "siglip")
RNG = np.random.default_rng(7)
WIDE = RNG.integers(0, 256, (50, 70, 3), dtype=np.uint8)  # (H, W, C)
TALL = RNG.integers(0, 256, (70, 50, 3), dtype=np.uint8)
TEXTS = ["the quick brown fox", "a cat sat on the mat"]


def encode_image(arr: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, mode=mode).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("image")
    return {"clip": build_clip(root / "clip"), "siglip": build_siglip(root / "siglip")}


def make_family(path: Path, precision: str = "fp32", **options: Any) -> ImageFamily:
    spec = ModelSpec(
        id="tiny/image", family="image", runtime="torch", sources=(str(path),), options=options
    )
    adapter = ImageFamily(spec, create_runtime("torch", device="cpu", precision=precision), path)
    adapter.load()
    adapter.warmup()
    return adapter


@pytest.fixture(scope="module")
def adapters(dirs: dict[str, Path]) -> dict[str, ImageFamily]:
    return {k: make_family(p) for k, p in dirs.items()}


def call(
    a: ImageFamily,
    body: dict[str, Any],
    enc: Encoding = Encoding.MSGPACK,
    task: Task = Task.ENCODE,
) -> tuple[Any, Any]:
    env = Envelope("r1", "tiny/image", task, enc, enc, 1, time.time() + 60)
    raw = msgspec.msgpack.encode(body) if enc is Encoding.MSGPACK else msgspec.json.encode(body)
    reply, prepared = run_like_worker(a, env, raw)
    dec = msgspec.msgpack.decode(reply) if enc is Encoding.MSGPACK else json.loads(reply)
    return dec, prepared


def hf_pixels(path: Path, kind: str, images: list[np.ndarray]) -> np.ndarray:
    """transformers' own (PIL backend) image processor, reading the same config."""
    if kind == "clip":
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil as P
    else:
        from transformers.models.siglip.image_processing_pil_siglip import (
            SiglipImageProcessorPil as P,
        )
    proc = P.from_pretrained(str(path))
    pil = [Image.fromarray(x) for x in images]
    return np.asarray(proc(images=pil, return_tensors="np")["pixel_values"])


def hf_embeddings(path: Path, kind: str, images: list[np.ndarray], texts: list[str]) -> Any:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path)).eval()
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    if kind == "siglip":  # trained with every text padded to the full length, unmasked
        tok.enable_padding(pad_id=0, length=model.config.text_config.max_position_embeddings)
    else:
        tok.enable_padding(pad_id=0)
    encs = tok.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encs])
    kw = {"attention_mask": torch.tensor([e.attention_mask for e in encs])}
    with torch.inference_mode():
        px = torch.from_numpy(hf_pixels(path, kind, images))
        img = model.get_image_features(pixel_values=px).pooler_output
        txt = model.get_text_features(input_ids=ids, **({} if kind == "siglip" else kw))
    img, txt = img.numpy(), txt.pooler_output.numpy()
    return unit(img), unit(txt)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# -- preprocessing ---------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_pixels_equal_transformers_image_processor(kind: str, adapters: dict[str, Any]) -> None:
    from fleetserve.families.image_preprocess import decode_image, pixels

    a = adapters[kind]
    rgba = RNG.integers(0, 256, (30, 20, 4), dtype=np.uint8)
    gray = RNG.integers(0, 256, (9, 13), dtype=np.uint8)
    for arr in (WIDE, TALL, rgba, gray):
        mine = pixels(decode_image(encode_image(arr), a.limits), a.config)
        want = hf_pixels(a.path, kind, [arr])[0]
        assert mine.shape == want.shape == (3, 32, 32)
        np.testing.assert_allclose(mine, want, atol=1e-6)


def test_pixels_by_hand() -> None:
    from fleetserve.families.image_preprocess import ImageConfig, center_crop, pixels, resize_shape

    cfg = ImageConfig(shortest_edge=2, crop=(2, 2), mean=(0.5, 0.25, 0.0), std=(0.5, 0.5, 2.0))
    arr = np.arange(2 * 4 * 3, dtype=np.uint8).reshape(2, 4, 3) * 10  # H=2, W=4: no resize
    out = pixels(Image.fromarray(arr), cfg)
    for c, (m, s) in enumerate(zip(cfg.mean, cfg.std, strict=True)):
        want = (arr[:, 1:3, c] / 255.0 - m) / s  # the middle two columns
        np.testing.assert_allclose(out[c], want, rtol=1e-6)
    assert resize_shape(50, 70, ImageConfig(shortest_edge=32)) == (32, 44)
    assert resize_shape(70, 50, ImageConfig(shortest_edge=32)) == (44, 32)
    assert resize_shape(70, 50, ImageConfig(size=(16, 24))) == (16, 24)
    padded = center_crop(np.full((1, 2, 1), 9, np.uint8), (3, 3))[..., 0]
    assert padded.tolist() == [[0, 0, 0], [0, 9, 9], [0, 0, 0]]  # ceil: extra pad on top, left


def test_image_config_old_form_and_defaults(tmp_path: Path) -> None:
    from fleetserve.families.image_preprocess import CLIP_MEAN, HALF, image_config

    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"size": 224, "crop_size": 224, "do_center_crop": True, "resample": 3})
    )
    old = image_config(tmp_path, "clip", 224)
    assert (old.shortest_edge, old.size, old.crop, old.mean) == (224, None, (224, 224), CLIP_MEAN)
    bare = image_config(tmp_path / "none", "siglip", 384)
    assert (bare.shortest_edge, bare.size, bare.crop, bare.mean) == (None, (384, 384), None, HALF)


def test_siglip_canonicalizes_text(adapters: dict[str, Any]) -> None:
    from fleetserve.families.image_preprocess import canonicalize

    assert canonicalize("  Hello,  World!\n") == "hello world"
    tok = adapters["siglip"].tokenizer
    assert (
        tok.encode(["Hello, World!"], truncate=True)[0]
        == tok.encode(["hello world"], truncate=True)[0]
    )
    tok = adapters["clip"].tokenizer
    assert (
        tok.encode(["Hello, World!"], truncate=True)[0]
        != tok.encode(["hello world"], truncate=True)[0]
    )


# -- embeddings ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("enc", [Encoding.MSGPACK, Encoding.JSON])
def test_embeddings_equal_transformers(kind: str, enc: Encoding, adapters: dict[str, Any]) -> None:
    a = adapters[kind]
    png, jpg = encode_image(WIDE), encode_image(TALL, "JPEG")
    if enc is Encoding.JSON:
        png = base64.b64encode(png).decode()
        jpg = "data:image/jpeg;base64," + base64.b64encode(jpg).decode()
    inputs = [{"image": png}, TEXTS[0], {"image": jpg}, {"text": TEXTS[1]}]
    out, prepared = call(a, {"inputs": inputs}, enc)
    emb = (
        array_from_wire(out["embeddings"])
        if enc is Encoding.MSGPACK
        else np.array(out["embeddings"])
    )
    tall_jpeg = np.asarray(Image.open(io.BytesIO(encode_image(TALL, "JPEG"))))  # lossy
    want_img, want_txt = hf_embeddings(a.path, kind, [WIDE, tall_jpeg], TEXTS)
    assert emb.shape == (4, a.dim)
    np.testing.assert_allclose(emb[[0, 2]], want_img, atol=2e-5)
    np.testing.assert_allclose(emb[[1, 3]], want_txt, atol=2e-5)
    patches = 16 + (kind == "clip")  # CLIP adds its class token
    text_cost = (
        [a.tokenizer.max_len] * 2
        if kind == "siglip"
        else [len(prepared.items[i][1]) for i in (1, 3)]
    )
    assert prepared.lengths == [patches, text_cost[0], patches, text_cost[1]]
    ntext = len(prepared.items[1][1]) + len(prepared.items[3][1])
    assert out["usage"] == {"tokens": 2 * patches + ntext, "images": 2}


def test_rows_do_not_depend_on_the_batch(adapters: dict[str, Any]) -> None:
    a = adapters["clip"]
    jpg = encode_image(TALL, "JPEG")
    body = {"inputs": [{"image": encode_image(WIDE)}, "a cat", " ".join(TEXTS), {"image": jpg}]}
    _, p = call(a, body)
    together = a.forward(p.items)
    alone = np.concatenate([a.forward([it]) for it in p.items])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_fp16_weights_take_fp16_pixels(dirs: dict[str, Path], adapters: dict[str, Any]) -> None:
    half = make_family(dirs["clip"], precision="fp16")
    body = {"inputs": [{"image": encode_image(WIDE)}, TEXTS[0]]}
    got = array_from_wire(call(half, body)[0]["embeddings"])
    want = array_from_wire(call(adapters["clip"], body)[0]["embeddings"])
    assert np.min(np.sum(got * want, axis=1)) > 0.999


# -- options and scoring ---------------------------------------------------------
def test_output_dtype_normalize_and_plain_string(adapters: dict[str, Any]) -> None:
    a = adapters["siglip"]
    png = encode_image(WIDE)
    base = array_from_wire(call(a, {"inputs": [{"image": png}]})[0]["embeddings"])
    half = array_from_wire(
        call(a, {"inputs": {"image": png}, "output_dtype": "float16"})[0]["embeddings"]
    )
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), base, atol=2e-3)
    raw = array_from_wire(
        call(a, {"inputs": [{"image": png}], "normalize": False})[0]["embeddings"]
    )
    np.testing.assert_allclose(raw / np.linalg.norm(raw), base, atol=1e-5)
    assert abs(float(np.linalg.norm(raw)) - 1.0) > 1e-3
    one = call(a, {"inputs": "a cat"}, Encoding.JSON)[0]
    assert np.array(one["embeddings"]).shape == (1, a.dim)


@pytest.mark.parametrize("kind", KINDS)
def test_score_is_cosine_to_the_query(kind: str, adapters: dict[str, Any]) -> None:
    a = adapters[kind]
    items = [{"image": encode_image(WIDE)}, "a cat", {"image": encode_image(TALL)}]
    emb = array_from_wire(call(a, {"inputs": [TEXTS[0], *items]})[0]["embeddings"])
    out, _ = call(a, {"query": TEXTS[0], "items": items}, Encoding.JSON, Task.SCORE)
    want = emb[1:] @ emb[0]
    np.testing.assert_allclose(out["scores"], want, atol=1e-5)
    assert out["ranking"] == [int(i) for i in np.argsort(-want, kind="stable")]
    by_image, _ = call(a, {"query": items[0], "items": ["a cat", items[2]]}, task=Task.SCORE)
    np.testing.assert_allclose(by_image["scores"], emb[[2, 3]] @ emb[1], atol=1e-5)


# -- bad input -------------------------------------------------------------------
PNG = encode_image(WIDE)
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"


@pytest.mark.parametrize(
    ("item", "enc", "reason"),
    [
        ({"image": RNG.bytes(300)}, Encoding.MSGPACK, "not an image in a supported format"),
        ({"image": PNG[: len(PNG) // 2]}, Encoding.MSGPACK, "could not be decoded"),
        ({"image": EPS}, Encoding.MSGPACK, "not an image in a supported format"),
        ({"image": b""}, Encoding.MSGPACK, "is empty"),
        ({"image": PNG, "text": "a cat"}, Encoding.MSGPACK, "exactly one of image or text"),
        ({}, Encoding.JSON, "exactly one of image or text"),
        ({"text": ""}, Encoding.JSON, "empty string"),
        ({"image": "not base64 at all!"}, Encoding.JSON, "not valid base64"),
        ({"image": "data:image/png,abc"}, Encoding.JSON, "not base64"),
        ({"image": base64.b64encode(RNG.bytes(90)).decode()}, Encoding.JSON, "not an image"),
    ],
)
def test_bad_item_is_400_naming_its_index(
    adapters: dict[str, Any], item: dict[str, Any], enc: Encoding, reason: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        call(adapters["clip"], {"inputs": ["a cat", item, "a dog"]}, enc)
    assert err.value.field == "inputs[1]"
    assert err.value.message.startswith("inputs[1] ") and reason in err.value.message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": []}, "inputs"),
        ({"inputs": ["a cat"], "output_dtype": "int8"}, "output_dtype"),
        ({"inputs": ["a cat", {"image": "aGk="}]}, "inputs[1].image"),  # msgpack wants bin
        ({"inputs": ["a", "the " * 40], "truncate": False}, "inputs[1]"),
    ],
)
def test_bad_request_names_the_field(adapters: dict[str, Any], body: Any, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        call(adapters["clip"], body)
    assert err.value.field == field


def with_size(png: bytes, width: int, height: int) -> bytes:
    """The PNG with its header claiming another size (a decompression bomb)."""
    ihdr = b"IHDR" + width.to_bytes(4, "big") + height.to_bytes(4, "big") + png[24:29]
    return png[:12] + ihdr + zlib.crc32(ihdr).to_bytes(4, "big") + png[33:]


def test_size_limits_are_400(dirs: dict[str, Path]) -> None:
    a = make_family(dirs["siglip"], max_image_bytes=len(PNG) - 1, max_image_pixels=3000)
    blank = encode_image(np.zeros((60, 60, 3), np.uint8))  # small file, 3600 pixels
    cases = [
        ({"image": PNG}, Encoding.MSGPACK, f"over the limit of {len(PNG) - 1} bytes"),
        ({"image": base64.b64encode(PNG * 2).decode()}, Encoding.JSON, "over the limit"),
        ({"image": blank}, Encoding.MSGPACK, "60x60 pixels, over the limit of 3000"),
        ({"image": with_size(blank, 20_000, 20_000)}, Encoding.MSGPACK, "more than 3000 pixels"),
    ]
    for item, enc, reason in cases:
        with pytest.raises(InvalidInput) as err:
            call(a, {"inputs": [item]}, enc)
        assert err.value.field == "inputs[0]" and reason in err.value.message
    big = make_family(dirs["clip"])  # the defaults: 10 MiB, 40 MP, checked before decoding
    with pytest.raises(InvalidInput, match="10000x5000 pixels, over the limit of 40000000"):
        call(big, {"inputs": [{"image": with_size(blank, 10_000, 5_000)}]})
    small = encode_image(np.zeros((40, 40, 3), np.uint8))
    assert call(a, {"inputs": [{"image": small}]})[0]["usage"]["images"] == 1


def test_wrong_runtime_or_model_fails_clearly(dirs: dict[str, Path], tmp_path: Path) -> None:
    from ..tinymodels import build_bert

    class Onnx:
        name, device, precision = "onnx", "cpu", "fp32"

    spec = ModelSpec(id="tiny/image", family="image", runtime="onnx", sources=("x",))
    with pytest.raises(ValueError, match="runtime: torch"):
        ImageFamily(spec, Onnx(), dirs["clip"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="serves clip and siglip"):
        make_family(build_bert(tmp_path / "bert"))
    with pytest.raises(ValueError, match="cannot open image formats"):
        make_family(dirs["clip"], image_formats=["PNG", "NOPE"])


# -- over HTTP -------------------------------------------------------------------
def test_http_encode_score_and_bad_image(
    dirs: dict[str, Path], adapters: dict[str, Any], tmp_path: Path
) -> None:
    import httpx

    from ..conftest import ServerThread, tiny_settings
    from ..tinymodels import write_spec

    write_spec(tmp_path, "tiny/clip", dirs["clip"], family="image", dimensions=24, max_seq_len=32)
    srv = ServerThread(tiny_settings(tmp_path, models="tiny/clip")).start()
    b64 = base64.b64encode(PNG).decode()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/encode/tiny/clip", json={"inputs": [{"image": b64}, "a cat"]})
            assert r.status_code == 200, r.text
            want = array_from_wire(
                call(adapters["clip"], {"inputs": [{"image": PNG}, "a cat"]})[0]["embeddings"]
            )
            np.testing.assert_allclose(np.array(r.json()["embeddings"]), want, atol=1e-5)
            mp = {"content-type": "application/msgpack"}
            r = c.post(
                "/v1/encode/tiny/clip",
                content=msgspec.msgpack.encode({"inputs": [{"image": PNG}]}),
                headers=mp,
            )
            assert r.status_code == 200
            np.testing.assert_allclose(
                array_from_wire(msgspec.msgpack.decode(r.content)["embeddings"]),
                want[:1],
                atol=1e-5,
            )
            r = c.post("/v1/score/tiny/clip", json={"query": "a cat", "items": [{"image": b64}]})
            assert r.status_code == 200 and len(r.json()["scores"]) == 1
            r = c.post("/v1/encode/tiny/clip", json={"inputs": ["a cat", {"image": "AAAA"}]})
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["field"] == "inputs[1]" and "inputs[1]" in err["message"]
    finally:
        srv.stop()
