"""Read the files that describe a model directory, and nothing else (no weights).

What a checkpoint says about itself is spread over several small JSON files:
transformers' ``config.json`` (``architectures``, ``model_type``, labels, ``auto_map``),
sentence-transformers' ``modules.json`` with each module's folder (``1_Pooling/``),
``sentence_bert_config.json`` and ``config_sentence_transformers.json``, the
tokenizer's ``tokenizer_config.json`` and chat template, GLiNER's
``gliner_config.json``, ``generation_config.json`` and stanford-nlp ColBERT's
``artifact.metadata``.
:func:`read_model_files` reads them once into a :class:`ModelFiles` for
:mod:`.infer`. A file that is absent is ``None``; one that is present but not the
JSON it should be is a :class:`CorruptFile` naming it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..wire import InvalidInput

JsonObject = dict[str, Any]
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_HEADER_LIMIT = 64 << 20  # a safetensors header larger than this is not one


class CheckpointError(InvalidInput):
    """A model directory whose files do not serve as asked (the base of the catalog's
    errors about checkpoints: corrupt, undecided, mismatched, remote code)."""


class CorruptFile(CheckpointError):
    """A describing file that is present but not the JSON it should be."""


@dataclass(frozen=True)
class StModule:
    """One entry of sentence-transformers' ``modules.json``."""

    type: str  # e.g. "sentence_transformers.models.Pooling"
    path: str  # its folder, relative to the model directory ("" for the root)

    @property
    def kind(self) -> str:
        """The class name alone: ``Pooling``, ``Normalize``, ``Transformer``, ``Dense``."""
        return self.type.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class ModelFiles:
    """The describing files of one model directory, parsed (``None``: absent)."""

    path: Path
    config: JsonObject | None = None  # config.json
    modules: tuple[StModule, ...] | None = None  # modules.json
    st_config: JsonObject | None = None  # sentence_bert_config.json
    st_meta: JsonObject | None = None  # config_sentence_transformers.json
    tokenizer_config: JsonObject | None = None  # tokenizer_config.json
    chat_template: str = ""  # which file holds a chat template ("": none)
    gliner: JsonObject | None = None  # gliner_config.json
    generation: JsonObject | None = None  # generation_config.json
    colbert_meta: JsonObject | None = None  # artifact.metadata (stanford-nlp ColBERT)
    colbert_linear: tuple[int, ...] | None = None  # linear.weight's shape in model.safetensors
    weights: tuple[str, ...] = ()  # weight files in the directory
    has_tokenizer_json: bool = False

    @property
    def architectures(self) -> tuple[str, ...]:
        archs = (self.config or {}).get("architectures") or ()
        return tuple(str(a) for a in archs) if isinstance(archs, list) else ()

    @property
    def model_type(self) -> str:
        return str((self.config or {}).get("model_type") or "")

    def module(self, kind: str) -> StModule | None:
        """The first sentence-transformers module of ``kind`` (``Pooling``), if any."""
        return next((m for m in self.modules or () if m.kind == kind), None)

    def module_config(self, module: StModule) -> tuple[JsonObject | None, str]:
        """A module folder's ``config.json`` and its path as evidence names it."""
        name = f"{module.path}/config.json" if module.path else "config.json"
        return read_json(self.path, name), name


def read_model_files(path: Path) -> ModelFiles:
    """Read every describing file of ``path`` (a local directory).

    A directory that does not exist is a :class:`CheckpointError`; a corrupt file a
    :class:`CorruptFile` naming it."""
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory of model files", field="source")
    mods = _read_any(path, "modules.json")
    if mods is not None and not (
        isinstance(mods, list) and all(isinstance(m, dict) and "type" in m for m in mods)
    ):
        raise CorruptFile(
            f"{path / 'modules.json'}: not a list of modules with a type each; "
            "fix or remove the file",
            field="source",
        )
    modules = (
        None
        if mods is None
        else tuple(StModule(str(m["type"]), str(m.get("path") or "")) for m in mods)
    )
    tok_config = read_json(path, "tokenizer_config.json")
    weights = tuple(
        sorted(f.name for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())
    )
    return ModelFiles(
        path=path,
        config=read_json(path, "config.json"),
        modules=modules,
        st_config=read_json(path, "sentence_bert_config.json"),
        st_meta=read_json(path, "config_sentence_transformers.json"),
        tokenizer_config=tok_config,
        chat_template=_chat_template(path, tok_config),
        gliner=read_json(path, "gliner_config.json"),
        generation=read_json(path, "generation_config.json"),
        colbert_meta=read_json(path, "artifact.metadata"),
        colbert_linear=_tensor_shape(path / "model.safetensors", "linear.weight"),
        weights=weights,
        has_tokenizer_json=(path / "tokenizer.json").is_file(),
    )


def read_json(path: Path, name: str) -> JsonObject | None:
    """``path/name`` as a JSON object; ``None`` when absent; else a :class:`CorruptFile`."""
    data = _read_any(path, name)
    if data is not None and not isinstance(data, dict):
        raise CorruptFile(
            f"{path / name}: a JSON object was expected, not {type(data).__name__}; "
            "fix or remove the file",
            field="source",
        )
    return data


def _read_any(path: Path, name: str) -> Any:
    file = path / name
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CorruptFile(
            f"{file}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix or remove the file",
            field="source",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise CorruptFile(f"{file}: cannot read it: {why}", field="source") from None


def _chat_template(path: Path, tok_config: JsonObject | None) -> str:
    """Which file holds a chat template, as transformers looks for one."""
    if tok_config and tok_config.get("chat_template"):
        return "tokenizer_config.json: chat_template"
    for name in ("chat_template.jinja", "chat_template.json"):
        if (path / name).is_file():
            return name
    return ""


def _tensor_shape(file: Path, name: str) -> tuple[int, ...] | None:
    """One tensor's shape from a safetensors header (the data is not read); ``None``
    when the file or the tensor is absent."""
    if not file.is_file():
        return None
    try:
        with file.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > _HEADER_LIMIT:
                raise ValueError("header too large")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as exc:
        raise CorruptFile(
            f"{file}: not a safetensors file ({exc}); fix or remove the file", field="source"
        ) from None
    info = header.get(name) if isinstance(header, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("shape"), list):
        return None
    return tuple(int(d) for d in info["shape"])


def tokenizer_lowercases(path: Path) -> bool:
    """Whether ``tokenizer.json``'s normalizer lowercases (BERT uncased, Lowercase)."""
    data = _read_any(path, "tokenizer.json")
    return isinstance(data, dict) and _lowercases(data.get("normalizer"))


def _lowercases(norm: object) -> bool:
    if not isinstance(norm, dict):
        return False
    kind = norm.get("type")
    if kind == "Lowercase":
        return True
    if kind == "BertNormalizer":
        return bool(norm.get("lowercase", True))
    if kind == "Sequence":
        return any(_lowercases(n) for n in norm.get("normalizers") or [])
    return False


__all__ = [
    "CheckpointError",
    "CorruptFile",
    "JsonObject",
    "ModelFiles",
    "StModule",
    "read_json",
    "read_model_files",
    "tokenizer_lowercases",
]
