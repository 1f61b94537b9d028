"""GLiNER text handling: word splitting, the label prompt, and span decoding.

The prompt is ``<<ENT>> label <<ENT>> label ... <<SEP>> word word ...``, tokenized
as pre-split words (as gliner does with ``is_split_into_words``). Each word of the
text is represented by its first subtoken (or last, or all of them for mean and max
pooling). Decoding keeps spans above the threshold, then greedily takes the best
spans that do not overlap (``flat_ner``) or that overlap only by nesting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Tokenizer

from ..wire.values import Array

if TYPE_CHECKING:
    import torch

_WORD = re.compile(r"\w+(?:[-_]\w+)*|\S")  # gliner's whitespace splitter


def split_words(text: str) -> tuple[list[str], list[int], list[int]]:
    """Words and their character start and end offsets."""
    words, starts, ends = [], [], []
    for m in _WORD.finditer(text):
        words.append(m.group())
        starts.append(m.start())
        ends.append(m.end())
    return words, starts, ends


@dataclass(frozen=True, slots=True)
class SpanItem:
    """One text with its label prompt, ready for the model."""

    ids: list[int]
    words_mask: list[int]  # per token: 1-based index of the word it pools into, else 0
    prompt_pos: list[int]  # token position of each label's prompt embedding
    num_words: int  # words of text kept (0: nothing to score)
    threshold: float


class PromptTokenizer:
    """Tokenizes label prompts and pre-split words with the checkpoint's tokenizer."""

    def __init__(
        self,
        tok: Tokenizer,
        *,
        ent_token: str,
        sep_token: str,
        pooling: str,
        embed_ent_token: bool,
        max_words: int,
        max_tokens: int,
    ) -> None:
        if tok.token_to_id(ent_token) is None:  # a bare encoder tokenizer: add gliner's tokens
            names = ["[FLERT]", ent_token, sep_token]
            tok.add_special_tokens([AddedToken(t, normalized=False) for t in names])
        ent = tok.token_to_id(ent_token)
        if ent is None or tok.token_to_id(sep_token) is None:
            raise ValueError(f"the tokenizer lacks GLiNER's {ent_token} or {sep_token} token")
        self._tok = tok
        self.ent_id = int(ent)
        self.ent_token, self.sep_token = ent_token, sep_token
        self.pooling = pooling
        self.shift = 0 if embed_ent_token else 1
        self.max_words = max_words
        self.max_tokens = max_tokens

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, labels: list[str], texts: list[list[str]], threshold: float) -> list[SpanItem]:
        """Items for word lists that share one label set.

        Texts keep their first ``max_words`` words, and fewer when their tokens pass
        ``max_tokens`` (``num_words`` says how many); a label set whose prompt alone does
        not fit raises ``ValueError``.
        """
        texts = [w[: self.max_words] for w in texts]
        prompt: list[str] = []
        for label in labels:
            prompt += [self.ent_token, label]
        prompt.append(self.sep_token)
        encs = self._tok.encode_batch([prompt + w for w in texts], is_pretokenized=True)
        items = []
        for words, enc in zip(texts, encs, strict=True):
            n = len(words)
            if len(enc.ids) > self.max_tokens:
                n = self._fit(enc.word_ids, len(prompt), n)
                enc = self._tok.encode(prompt + words[:n], is_pretokenized=True)
            items.append(self._item(enc.ids, enc.word_ids, len(prompt), n, threshold))
        return items

    def _fit(self, word_ids: list[int | None], n_prompt: int, n_words: int) -> int:
        """How many text words fit in ``max_tokens``, with the closing special tokens."""
        last = max(i for i, w in enumerate(word_ids) if w is not None)
        room = self.max_tokens - (len(word_ids) - 1 - last)  # positions left for words
        ends: dict[int, int] = {}
        for i, w in enumerate(word_ids):
            if w is not None:
                ends[w] = i
        if any(ends.get(w, -1) >= room for w in range(n_prompt)):
            raise ValueError("the labels alone are longer than the model's token limit")
        n = 0
        while n < n_words and ends.get(n_prompt + n, -1) < room:  # a word without tokens fits
            n += 1
        return n

    def _item(
        self, ids: list[int], word_ids: list[int | None], n_prompt: int, n: int, thr: float
    ) -> SpanItem:
        mask = [0] * len(ids)
        for i, w in enumerate(word_ids):
            if w is None or w < n_prompt:
                continue
            nxt = word_ids[i + 1] if i + 1 < len(ids) else None
            prev = word_ids[i - 1] if i > 0 else None
            if (
                self.pooling in ("mean", "max")
                or (self.pooling == "first" and prev != w)
                or (self.pooling == "last" and nxt != w)
            ):
                mask[i] = w - n_prompt + 1
        pos = [i + self.shift for i, t in enumerate(ids) if t == self.ent_id]
        return SpanItem(ids, mask, pos, n, thr)


def candidates(
    probs: torch.Tensor, items: list[SpanItem], num_labels: list[int]
) -> list[tuple[Array, Array]]:
    """Spans above each item's threshold: per item ``(idx [n, 3] = start, width, label;
    scores [n])`` in (start, width, label) order. ``probs`` is a torch ``[B, W, K, C]``."""
    import torch

    batch, width, k, c = probs.shape
    dev = probs.device
    n_words = torch.tensor([it.num_words for it in items], device=dev)
    n_labels = torch.tensor(num_labels, device=dev)
    thr = torch.tensor([it.threshold for it in items], device=dev, dtype=probs.dtype)
    span_end = torch.arange(width, device=dev)[:, None] + torch.arange(k, device=dev)
    ok_span = span_end[None] < n_words[:, None, None]  # [B, W, K]
    ok_label = torch.arange(c, device=dev)[None] < n_labels[:, None]  # [B, C]
    keep = ok_span[..., None] & ok_label[:, None, None] & (probs > thr[:, None, None, None])
    b, s, w, lab = torch.where(keep)
    scores = probs[b, s, w, lab].cpu().numpy()
    idx = torch.stack([b, s, w, lab], dim=1).cpu().numpy()
    out = []
    for row in range(batch):
        sel = idx[:, 0] == row
        out.append((idx[sel, 1:], scores[sel]))
    return out


def greedy(
    idx: Array, scores: Array, *, flat: bool, multi_label: bool
) -> list[tuple[int, int, int, float]]:
    """gliner's greedy search: best first, dropping spans that clash with a kept one
    (any overlap when ``flat``, else a partial overlap; the same span with another label
    unless ``multi_label``). Returns ``(start_word, end_word, label, score)`` by start."""
    spans = [
        (int(s), int(s + k), int(c), float(p)) for (s, k, c), p in zip(idx, scores, strict=True)
    ]
    spans.sort(key=lambda x: -x[3])  # stable: ties keep (start, width, label) order
    kept: list[tuple[int, int, int, float]] = []
    if flat:  # kept spans never overlap: an owner per word makes each check O(width)
        owner: dict[int, tuple[int, int]] = {}
        for span in spans:
            here = {owner.get(w) for w in range(span[0], span[1] + 1)} - {None}
            if not here or (multi_label and here == {span[:2]}):
                kept.append(span)
                owner.update(dict.fromkeys(range(span[0], span[1] + 1), span[:2]))
    else:
        for span in spans:
            if not any(_partial_overlap(span, other, multi_label) for other in kept):
                kept.append(span)
    kept.sort(key=lambda x: x[0])
    return kept


def _partial_overlap(
    a: tuple[int, int, int, float], b: tuple[int, int, int, float], multi: bool
) -> bool:
    if a[:2] == b[:2]:
        return not multi
    disjoint = a[0] > b[1] or b[0] > a[1]
    nested = (a[0] <= b[0] and a[1] >= b[1]) or (b[0] <= a[0] and b[1] >= a[1])
    return not (disjoint or nested)
