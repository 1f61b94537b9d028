"""ColBERT checkpoints: the projection after the encoder and the settings shipped with it.

Two layouts are read, both without torch (the projection runs in numpy):

- **HF** (stanford-nlp ColBERT, e.g. ``colbert-ir/colbertv2.0``): ``config.json`` names
  the architecture ``HF_ColBERT`` and ``model.safetensors`` holds ``linear.weight``
  ``[out, hidden]`` (no bias) next to the ``bert.*`` weights; ``artifact.metadata``
  (JSON) may give the marker tokens, lengths and punctuation masking.
- **PyLate** (sentence-transformers style): ``modules.json`` lists a Transformer module,
  then one or more Dense modules, each in its folder (``1_Dense/``) with ``config.json``
  (``in_features``, ``out_features``, ``bias``, ``activation_function``, ``use_residual``)
  and ``model.safetensors`` (``linear.weight``, ``linear.bias``, ``residual.weight``);
  ``config_sentence_transformers.json`` gives the prefixes, lengths and skiplist.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..wire.values import Array

_ACTIVATIONS = {"identity": "identity", "tanh": "tanh", "relu": "relu"}
_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}


@dataclass(frozen=True)
class Dense:
    """One linear layer: ``act(x @ weight.T + bias)``, plus the input when residual."""

    weight: Array  # [out, in], float32
    bias: Array | None = None
    activation: str = "identity"
    residual: bool = False
    residual_weight: Array | None = None  # when in != out

    def __call__(self, x: Array) -> Array:
        y = x @ self.weight.T
        if self.bias is not None:
            y = y + self.bias
        if self.activation == "tanh":
            y = np.tanh(y)
        elif self.activation == "relu":
            y = np.maximum(y, 0)
        if self.residual:
            y = y + (x if self.residual_weight is None else x @ self.residual_weight.T)
        return np.asarray(y, dtype=np.float32)


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint adds to its encoder: layout, projection layers and settings."""

    layout: str  # "hf", "pylate" or "plain"
    encoder_dir: Path  # where the transformer weights and tokenizer are
    layers: tuple[Dense, ...] = ()
    settings: dict[str, object] | None = None  # in the adapter's option names

    def project(self, x: Array) -> Array:
        for layer in self.layers:
            x = layer(x)
        return x

    @property
    def nbytes(self) -> int:
        return sum(layer.weight.nbytes for layer in self.layers)


def read_checkpoint(path: Path) -> Checkpoint:
    modules = path / "modules.json"
    if modules.is_file():
        mods = json.loads(modules.read_text())
        dense = [m for m in mods if str(m.get("type", "")).endswith("Dense")]
        if dense:
            enc: dict[str, object] = next(
                (m for m in mods if "Transformer" in str(m.get("type", ""))), {}
            )
            return Checkpoint(
                "pylate",
                path / str(enc.get("path", "")),
                tuple(_st_dense(path / str(m["path"])) for m in dense),
                _pylate_settings(path / "config_sentence_transformers.json"),
            )
    config = path / "config.json"
    archs = json.loads(config.read_text()).get("architectures") or [] if config.is_file() else []
    weights = path / "model.safetensors"
    if "HF_ColBERT" in archs or (weights.is_file() and "linear.weight" in _header(weights)):
        w = read_tensor(weights, "linear.weight")
        return Checkpoint("hf", path, (Dense(w),), _stanford_settings(path / "artifact.metadata"))
    return Checkpoint("plain", path)


def _st_dense(folder: Path) -> Dense:
    cfg = json.loads((folder / "config.json").read_text())
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{folder}: needs model.safetensors (pytorch_model.bin is not read)")
    names = _header(weights)
    act_path = str(cfg.get("activation_function", "torch.nn.modules.linear.Identity"))
    act = _ACTIVATIONS.get(act_path.rsplit(".", 1)[-1].lower())
    if act is None:
        raise ValueError(f"{folder}: unsupported activation_function {act_path!r}")
    w = read_tensor(weights, "linear.weight")
    if w.shape != (int(cfg["out_features"]), int(cfg["in_features"])):
        raise ValueError(f"{folder}: linear.weight is {w.shape}, config says otherwise")
    bias = read_tensor(weights, "linear.bias") if "linear.bias" in names else None
    res = read_tensor(weights, "residual.weight") if "residual.weight" in names else None
    return Dense(w, bias, act, bool(cfg.get("use_residual", False)), res)


def _pylate_settings(file: Path) -> dict[str, object]:
    cfg = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    keys = {
        "query_prefix": "query_prefix",
        "document_prefix": "document_prefix",
        "query_length": "query_length",
        "document_length": "document_length",
        "do_query_expansion": "query_expansion",
        "attend_to_expansion_tokens": "attend_to_expansion",
        "skiplist_words": "skiplist",
    }
    out: dict[str, object] = {"skip_punctuation": "documents", "query_expansion": True}
    out.update({ours: cfg[theirs] for theirs, ours in keys.items() if cfg.get(theirs) is not None})
    return out


def _stanford_settings(file: Path) -> dict[str, object]:
    meta = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    return {
        "query_prefix": meta.get("query_token_id", "[unused0]"),
        "document_prefix": meta.get("doc_token_id", "[unused1]"),
        "query_length": int(meta.get("query_maxlen", 32)),
        "document_length": int(meta.get("doc_maxlen", 180)),
        "query_expansion": True,
        "attend_to_expansion": bool(meta.get("attend_to_mask_tokens", False)),
        "skip_punctuation": "documents" if meta.get("mask_punctuation", True) else "none",
    }


# -- safetensors, read by hand so that bf16 and big files need neither torch nor RAM --------
def _header(file: Path) -> dict[str, Any]:
    with file.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def read_tensor(file: Path, name: str) -> Array:
    """One tensor of a safetensors file as float32."""
    header = _header(file)
    if name not in header:
        raise ValueError(f"{file}: no tensor {name!r}")
    info = header[name]
    start, end = info["data_offsets"]
    with file.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + n + start)
        raw = f.read(end - start)
    if info["dtype"] == "BF16":
        arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    elif info["dtype"] in _ST_DTYPES:
        arr = np.frombuffer(raw, _ST_DTYPES[info["dtype"]])
    else:
        raise ValueError(f"{file}: {name} has unsupported dtype {info['dtype']}")
    return np.ascontiguousarray(arr.reshape(info["shape"]), dtype=np.float32)
