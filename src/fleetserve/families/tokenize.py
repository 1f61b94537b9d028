"""Fast text tokenization with the model's own ``tokenizer.json``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from tokenizers import Encoding, Tokenizer

KEPT_TOKENIZERS = 16  # parsed tokenizers kept for reloads (a BERT's: ~1 MB, ~20 ms)


@functools.lru_cache(maxsize=KEPT_TOKENIZERS)
def _parsed(file: str, stamp: tuple[int, int], max_len: int) -> Tokenizer:
    """``file`` parsed and set to truncate at ``max_len``, once per file version
    (``stamp``: its modification time and size): a model's reload, or another copy
    of it, does not parse it again (on a 2-core cpu-avx2, parsing MiniLM's took 15 %
    of a reload's 140 ms). Only encoding reads it after (from any thread)."""
    tok = Tokenizer.from_file(file)
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    return tok


class TextTokenizer:
    """Wraps a Hugging Face fast tokenizer with truncation at the model's limit."""

    def __init__(self, path: Path, max_len: int) -> None:
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing: fleetserve needs a fast tokenizer")
        st = file.stat()
        self._tok = _parsed(str(file.resolve()), (st.st_mtime_ns, st.st_size), max_len)
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
        # the long texts' cuts were tokenized while cutting: only the others are now
        encs = encoded(self.cut(texts), self._tok.encode_batch)
        if not truncate:
            for i, e in enumerate(encs):
                if e.overflowing:
                    return [], i
        return [e.ids for e in encs], None

    def cut(self, texts: list[str]) -> list[str]:
        """``texts`` with each long one cut to a prefix that still overflows ``max_len``
        (:func:`cut_long`: a :class:`Cut`, with the cuts' encodings)."""
        return cut_long(texts, self.max_len, self._tok.encode_batch, lambda e: bool(e.overflowing))


def cut_long(
    texts: list[str],
    max_tokens: int,
    encode: Callable[[list[str]], list[Encoding]],
    more: Callable[[Encoding], bool],
) -> Cut:
    """``texts`` with each long one cut, at a space, to a prefix that still holds more
    than ``max_tokens`` tokens (``more`` says whether an encoding does): the same ids
    come out of the first ``max_tokens``, but a 1 MiB text is not tokenized whole (the
    tokenizer builds every token, and every overflowing piece, before it truncates:
    +266 MiB and 2.3 s for one such text). A prefix that holds too few tokens is
    doubled until it does, or is the whole text. The :class:`Cut` it returns holds the
    encoding ``encode`` gave each text it cut (:func:`encoded` reuses them rather than
    tokenize the cuts again)."""
    out = Cut(texts)
    size = max_tokens * CHARS_PER_TOKEN
    todo = [i for i, t in enumerate(texts) if len(t) > size]
    while todo:
        heads = [_prefix(texts[i], size) for i in todo]
        encs = encode(heads)
        for i, head, e in zip(todo, heads, encs, strict=True):
            if more(e):
                out[i] = head
                out.done[i] = e
        size *= 2
        todo = [i for i, e in zip(todo, encs, strict=True) if not more(e)]
        todo = [i for i in todo if len(texts[i]) > size]
    return out


class Cut(list[str]):
    """Texts as :func:`cut_long` left them, and the encodings of those it cut (by index)."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__(texts)
        self.done: dict[int, Encoding] = {}


def encoded(texts: list[str], encode: Callable[[list[str]], list[Encoding]]) -> list[Encoding]:
    """The encodings of ``texts`` (from ``encode``), but for the texts a :class:`Cut`
    holds encodings of already: those are taken as they are."""
    done = texts.done if isinstance(texts, Cut) else {}
    if not done:
        return list(encode(texts))
    rest = [i for i in range(len(texts)) if i not in done]
    out = dict(done)
    if rest:
        out.update(zip(rest, encode([texts[i] for i in rest]), strict=True))
    return [out[i] for i in range(len(texts))]


CHARS_PER_TOKEN = 8  # a first cut's length per token of max_len (English: ~4.5)


def _prefix(text: str, size: int) -> str:
    """``text`` up to its last whitespace within ``size`` characters (tokenizers split
    words there: every word kept is whole), else its first ``size`` characters."""
    head = text[:size]
    for i in range(len(head) - 1, max(-1, len(head) - 200), -1):
        if head[i].isspace():
            return head[:i]
    return head
