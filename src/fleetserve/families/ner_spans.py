"""Aggregating per-token tag probabilities into labelled character spans.

The rules are those of transformers' token-classification pipeline, so served spans
equal the pipeline's on the same model:

- ``simple``: each token takes its argmax tag;
- ``first`` / ``average`` / ``max``: each *word* (tokens sharing a word id from the
  fast tokenizer) takes one tag, from its first token, its mean distribution, or its
  most confident token.

Then adjacent units with the same tag merge unless the next one starts with ``B-``
(so BIO, IOB1 and plain tags all work). A span's score is the mean of its units'
probabilities, and its offsets run from the first unit's start to the last one's end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..wire.values import Array

STRATEGIES = ("simple", "first", "average", "max")


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int
    label: str
    score: float


def softmax(logits: Array) -> Array:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    out: Array = shifted / shifted.sum(axis=-1, keepdims=True)
    return out


def split_tag(label: str) -> tuple[str, str]:
    """``B-PER`` -> (``B``, ``PER``); ``I-PER`` and plain ``PER`` -> (``I``, ``PER``)."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _units(
    probs: Array,
    offsets: list[tuple[int, int]],
    words: list[int | None],
    strategy: str,
) -> list[tuple[int, float, int, int]]:
    """(tag index, probability, start, end) per token (``simple``) or per word."""
    tokens = [i for i, w in enumerate(words) if w is not None]
    if strategy == "simple":
        groups = [[i] for i in tokens]
    else:
        groups = []
        for i in tokens:
            if groups and words[groups[-1][-1]] == words[i]:
                groups[-1].append(i)
            else:
                groups.append([i])
    units = []
    for g in groups:
        if strategy == "average":
            dist = probs[g].mean(axis=0)
        elif strategy == "max":
            dist = probs[max(g, key=lambda i: float(probs[i].max()))]
        else:  # simple (one token) or first
            dist = probs[g[0]]
        tag = int(dist.argmax())
        units.append((tag, float(dist[tag]), offsets[g[0]][0], offsets[g[-1]][1]))
    return units


def aggregate(
    probs: Array,
    offsets: list[tuple[int, int]],
    words: list[int | None],
    labels: list[str],
    strategy: str,
) -> list[Span]:
    """Spans for one window: ``probs`` is [tokens, tags]; ``words[i]`` is None for
    special tokens, which are skipped."""
    if strategy not in STRATEGIES:
        raise ValueError(f"aggregation must be one of {', '.join(STRATEGIES)}")
    out: list[Span] = []
    group: list[tuple[int, float, int, int]] = []
    last_tag = ""
    for unit in _units(probs, offsets, words, strategy):
        bi, tag = split_tag(labels[unit[0]])
        if group and (tag != last_tag or bi == "B"):
            out.append(_span(group, last_tag))
            group = []
        group.append(unit)
        last_tag = tag  # a group's units all share its tag
    if group:
        out.append(_span(group, last_tag))
    return out


def _span(group: list[tuple[int, float, int, int]], tag: str) -> Span:
    score = float(np.mean([u[1] for u in group]))
    return Span(group[0][2], group[-1][3], tag, score)


def merge_overlapping(spans: list[Span]) -> list[Span]:
    """Spans found in overlapping windows: of two that overlap, keep the longer one
    (on a tie, the higher score), as the pipeline does for strided chunks."""
    if not spans:
        return spans
    ordered = sorted(spans, key=lambda s: s.start)
    out: list[Span] = []
    prev = ordered[0]
    for s in ordered[1:]:
        if prev.start <= s.start < prev.end:
            longer = s.end - s.start > prev.end - prev.start
            tie = s.end - s.start == prev.end - prev.start
            if longer or (tie and s.score > prev.score):
                prev = s
        else:
            out.append(prev)
            prev = s
    out.append(prev)
    return out
