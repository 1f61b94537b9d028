"""Shared by the extraction families (``/v1/extract/{model}``): body parsing and the
fast tokenizer with its pad id."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from ..wire import Envelope, InvalidInput
from ..wire.codec import TypedDecoder
from ..wire.requests import ExtractRequest

_EXTRACT = TypedDecoder(ExtractRequest)


def fast_tokenizer(path: Path) -> tuple[Tokenizer, int]:
    """The model's fast tokenizer without padding or truncation, and its pad id.

    From ``tokenizer.json``, else converted by transformers from the slow tokenizer's
    files (older hub repositories ship only ``vocab.txt`` or ``spm.model``)."""
    file = path / "tokenizer.json"
    tok = Tokenizer.from_file(str(file)) if file.is_file() else _convert(path)
    tok.no_padding()
    tok.no_truncation()
    pad = tok.padding
    pid = pad.get("pad_id") if pad else None
    for name in ("[PAD]", "<pad>"):
        if pid is None:
            pid = tok.token_to_id(name)
    return tok, int(pid or 0)


def _convert(path: Path) -> Tokenizer:
    """Build the fast tokenizer from a slow one's files (vocab.txt, spm.model)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ImportError(
            f"{path} has no tokenizer.json; building one needs transformers: "
            "pip install 'fleetserve[torch]'"
        ) from exc
    backend = getattr(AutoTokenizer.from_pretrained(str(path)), "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise FileNotFoundError(f"{path} has no tokenizer.json and no convertible tokenizer")
    return backend


def parse_extract(envelope: Envelope, body: bytes) -> ExtractRequest:
    """Decode an extract body; ``inputs`` becomes a non-empty list of non-empty strings."""
    req: ExtractRequest = _EXTRACT.decode(body, envelope.content_type)
    if isinstance(req.inputs, str):
        req.inputs = [req.inputs]
    if not req.inputs:
        raise InvalidInput("inputs must not be empty", field="inputs")
    for i, t in enumerate(req.inputs):
        if not t.strip():
            raise InvalidInput(f"inputs[{i}] is empty", field=f"inputs[{i}]")
    if req.threshold is not None and not 0.0 <= req.threshold <= 1.0:
        raise InvalidInput("threshold must be between 0 and 1", field="threshold")
    return req
