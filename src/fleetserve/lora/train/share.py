"""A training run within its share of the memory budget (``train_memory_share``).

Before the first step the trainer measures what one text costs it: a forward and a
backward pass of one text at the sequence length, through the LoRA, the resident
set's peak above what the process held before (its first pass, freed heap given back
first: a second pass reused the first's heap and read too little). The share, less
what the process holds above where the run began (the base model, its scores), buys that
many texts at once, four fifths of it to leave room for the rest of a step (the loss,
the optimizer, the allocator's slack). The batch then runs in micro-batches of that
many texts (sentence-transformers' cached multiple-negatives loss: the batch's in-batch
negatives stay the batch's, its gradient is the same; only the memory changes). The
length is found from below: ``MIN_SEQ_LEN`` tokens first, then twice that while the
last figure, times ``GROWTH``, still fits (a measurement must not itself pass the
share), up to the spec's length; where not even ``MIN_SEQ_LEN`` fits, the run fails
as out of memory, with the figures.

Measuring (the base before training, the adapter after) encodes without gradients, in
batches the share also bounds: one text's inference pass is measured the same way
once the model is loaded, and the batch holds as many as fit (at most the trainer's
64). Those texts are never cut: the scores are the served model's.

A reranker's run (``rerank.py``) measures the same way with one (query, passage) pair
for a text; its batches run in micro-batches by gradient accumulation (its loss is
per pair, so the gradient is the same).

The run's peak growth (over all of it: measuring, mining, training, measuring again)
is returned with the result, so that a caller can check it against the share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...fleet.memory import peak_bytes, reset_peak, rss_bytes, trim
from .errors import OutOfMemory

if TYPE_CHECKING:
    from sentence_transformers.base.model import BaseModel  # a bi- or cross-encoder

MIN_SEQ_LEN = 32  # the shortest sequences a run is cut to
GROWTH = 3  # at most what doubling the length multiplies a text's cost by (attention: 4)
HEADROOM = 0.8  # of the share left: the micro-batch's activations; the rest, the step's


@dataclass(frozen=True)
class Fit:
    """What fits the share: ``micro_batch`` texts at a time of at most ``max_seq_len``
    tokens, each taking ``per_text`` bytes in a training pass; ``room``: the share
    left after what the run held before its first step."""

    share: int
    room: int
    per_text: int
    micro_batch: int
    max_seq_len: int

    def describe(self, batch_size: int, max_seq_len: int) -> str:
        mib = 1 << 20
        parts = [f"{self.share / mib:.0f} MiB share: {self.room / mib:.0f} MiB for "
                 f"activations, {self.per_text / mib:.1f} MiB a text"]  # fmt: skip
        if self.micro_batch < batch_size:
            texts = "text" if self.micro_batch == 1 else "texts"
            parts.append(f"batches of {batch_size} run {self.micro_batch} {texts} at a time")
        if self.max_seq_len < max_seq_len:
            parts.append(f"texts cut to {self.max_seq_len} tokens (from {max_seq_len})")
        return "; ".join(parts)


class Watch:
    """The run's resident-set peak above where it began, across the probes' resets."""

    def __init__(self) -> None:
        trim()
        reset_peak()
        self.start = rss_bytes()
        self._seen = self.start

    def grown(self) -> int:
        """What the process holds now above its start (the heap's free pages given
        back first: they are no more held than the next batch can take them)."""
        self._seen = max(self._seen, peak_bytes())
        trim()
        return max(0, rss_bytes() - self.start)

    def reset(self) -> None:
        """Before a measurement of its own: the peak so far is kept."""
        self._seen = max(self._seen, peak_bytes())
        reset_peak()

    def peak_growth(self) -> int:
        return max(0, max(self._seen, peak_bytes()) - self.start)


def encoding_cost(model: BaseModel, watch: Watch) -> int:
    """What encoding one text at the model's sequence length takes (no gradients)."""
    import torch

    with torch.no_grad():
        return _measured(model, lambda features: model(dict(features)), watch)


def encode_batch(share: int, per_text: int, most: int, watch: Watch) -> int:
    """How many texts of ``per_text`` bytes one encoding batch may hold now."""
    room = share - watch.grown()
    if per_text > room * HEADROOM:
        mib = 1 << 20
        raise OutOfMemory(
            f"the training share ({share / mib:.0f} MiB, train_memory_share) leaves "
            f"{max(0, room) / mib:.0f} MiB after the model, and encoding one "
            f"text takes {per_text / mib:.1f} MiB"
        )
    return max(1, min(most, int(room * HEADROOM // per_text)))


def fit(model: BaseModel, share: int, batch_size: int, max_seq_len: int, watch: Watch) -> Fit:
    """The micro-batch and sequence length that fit ``share`` bytes of growth."""
    room = share - watch.grown()
    seq = min(MIN_SEQ_LEN, max_seq_len)
    per_text = _per_text(model, seq, watch)
    while seq < max_seq_len and per_text * GROWTH <= room * HEADROOM:
        longer = min(2 * seq, max_seq_len)  # measured only where it should fit
        cost = _per_text(model, longer, watch)
        if cost > room * HEADROOM:
            break
        seq, per_text = longer, cost
    model.max_seq_length = max_seq_len
    if per_text > room * HEADROOM:
        mib = 1 << 20
        raise OutOfMemory(
            f"the training share ({share / mib:.0f} MiB, train_memory_share) leaves "
            f"{max(0, room) / mib:.0f} MiB after the model, and one text of {seq} tokens "
            f"takes {per_text / mib:.1f} MiB to train on"
        )
    micro = max(1, min(batch_size, int(room * HEADROOM // max(1, per_text))))
    return Fit(share, room, per_text, micro, seq)


def _per_text(model: BaseModel, seq: int, watch: Watch) -> int:
    """A training pass's peak over one text of ``seq`` tokens."""
    model.max_seq_length = seq
    model.train()
    try:
        return _measured(model, lambda features: _step(model, features), watch)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


def _measured(model: BaseModel, run: Callable[[Any], object], watch: Watch) -> int:
    """The peak of ``run`` over one text at the model's sequence length, above what was
    held before it. Its first run: a second would reuse the heap the first freed, which
    the resident set still holds, and read less than a batch of fresh texts takes."""
    text = " ".join(["measure"] * (2 * (model.max_seq_length or 512)))  # cut to the length
    features = model.preprocess([(text, text) if _pairs(model) else text])
    trim()
    watch.reset()
    before = rss_bytes()
    run(features)
    return max(1, peak_bytes() - before)


def _pairs(model: BaseModel) -> bool:
    """Whether ``model`` reads (query, passage) pairs: a cross-encoder."""
    from sentence_transformers.cross_encoder import CrossEncoder

    return isinstance(model, CrossEncoder)


def _step(model: BaseModel, features: Any) -> None:
    got = model(dict(features))
    out = got["scores"] if _pairs(model) else got["sentence_embedding"]
    out.float().pow(2).sum().backward()
    model.zero_grad(set_to_none=True)
    del out


__all__ = ["HEADROOM", "MIN_SEQ_LEN", "Fit", "Watch", "encode_batch", "encoding_cost", "fit"]
