"""Where ``fleetserve add``'s SOURCE is on this machine, and whether it can be a model.

SOURCE is a local directory, an HF-cache id (``hf:org/name``) or an object-store prefix
(``s3://bucket/prefix``, fetched once into the cache). What is refused here, before
anything is read further or written, in one line naming the file: a source that does
not exist, a directory with no weights, a describing JSON file that does not parse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..catalog.fetch import is_object_uri
from ..catalog.names import id_for_source
from ..catalog.weights import resolve_sources
from ..settings import Settings
from ..wire import FleetError

WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.onnx", "openvino_model.xml", "*.gguf")
# the files that describe a model: each must parse where it exists
DESCRIBING = (
    "config.json",
    "modules.json",
    "1_Pooling/config.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "gliner_config.json",
)


class Refused(Exception):
    """``add`` stops with nothing written: ``code`` 2 for bad input (the source, the
    id, the catalog), 1 for a model that failed its reference check or its tune."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message, self.code = message, code


@dataclass(frozen=True)
class Located:
    """The source as the spec names it, where its files are here, and the id it gets
    unless ``--id`` names another."""

    source: str
    path: Path
    default_id: str


def locate(source: str, settings: Settings) -> Located:
    """``source`` resolved and checked (see the module's docstring)."""
    text = source.strip()
    if not text:
        raise Refused("SOURCE is empty: name a model directory, hf:org/name or s3://bucket/prefix")
    if text.startswith("hf:") or is_object_uri(text):
        try:
            path = resolve_sources(text, (text,), settings)
        except FleetError as exc:
            raise Refused(exc.message) from None
        named = text
    else:
        local = Path(text.removeprefix("file://")).expanduser()
        if not local.exists():
            raise Refused(f"{local}: no such directory")
        if not local.is_dir():
            raise Refused(f"{local}: not a directory (name the model's directory)")
        path = local.resolve()
        named = str(path)
    check_files(path)
    return Located(named, path, id_for_source(named))


def check_files(path: Path) -> None:
    """Weights present, and each describing file that exists parses."""
    if not any(next(path.glob(pattern), None) for pattern in WEIGHTS):
        raise Refused(
            f"{path}: no weights (looked for {', '.join(WEIGHTS)}); is this the model's directory?"
        )
    for name in DESCRIBING:
        f = path / name
        if not f.is_file():
            continue
        try:
            json.loads(f.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise Refused(f"{f}: not valid JSON ({exc})") from None
    for f in path.glob("*.safetensors"):
        if f.stat().st_size < 8:
            raise Refused(f"{f}: truncated (a safetensors file starts with an 8-byte header)")
