"""Fast text tokenization with the model's own ``tokenizer.json``."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class TextTokenizer:
    """Wraps a Hugging Face fast tokenizer with truncation at the model's limit."""

    def __init__(self, path: Path, max_len: int) -> None:
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing: fleetserve needs a fast tokenizer")
        self._tok = Tokenizer.from_file(str(file))
        self._tok.no_padding()
        self._tok.enable_truncation(max_length=max_len)
        self.max_len = max_len
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)  # ids below it
        pad = self._tok.padding
        pid = pad.get("pad_id") if pad is not None else None
        for name in ("[PAD]", "<pad>"):  # BERT, then RoBERTa/XLM-R (where 0 is <s>)
            if pid is None:
                pid = self._tok.token_to_id(name)
        self.pad_id = int(pid or 0)

    def encode(self, texts: list[str], *, truncate: bool) -> tuple[list[list[int]], int | None]:
        """Token ids per text, and the index of the first over-long text when not truncating."""
        encs = self._tok.encode_batch(texts)
        if not truncate:
            for i, e in enumerate(encs):
                if e.overflowing:
                    return [], i
        return [e.ids for e in encs], None
