"""Token choice (greedy, temperature, top-p, seeded) and text release with stop strings."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...wire.values import Array

MASKED = float("-inf")


def new_generator(seed: int | None) -> torch.Generator:
    """A CPU generator per sequence: a seed gives the same tokens whatever the batch."""
    gen = torch.Generator(device="cpu")
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed % (1 << 63))
    return gen


def choose(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
    allowed: torch.Tensor | None = None,
) -> int:
    """One token from one row of logits; ``allowed`` (bool, vocab-long) masks the rest."""
    row = logits.float()
    if allowed is not None:
        row = row.masked_fill(~allowed.to(row.device), MASKED)
    if temperature <= 0.0:
        return int(row.argmax().item())
    scaled = row.cpu() / temperature
    if not bool(torch.isfinite(scaled.max())):  # so tiny a temperature (1e-40) is greedy:
        return int(row.argmax().item())  # the logits over it overflow float32
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # the smallest set reaching top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator).item())


class TextStream:
    """Releases decoded text as tokens arrive, holding back what may still turn into a
    stop string or is an incomplete UTF-8 character; stop strings end the text."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> None:
        self._decode = decode
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self.sent = 0  # characters of ``text`` released so far

    def update(self, ids: Sequence[int]) -> tuple[str, bool]:
        """Decode ``ids`` (all generated so far); return the newly releasable text and
        whether a stop string appeared (the text then ends before it)."""
        text = self._decode(ids)
        cut = self._find_stop(text)
        if cut is not None:
            self.text = text[:cut]
            return self._release(len(self.text)), True
        self.text = text
        end = len(text) - self._held(text)
        while end > self.sent and text[end - 1] == "\ufffd":  # a partial UTF-8 character
            end -= 1
        return self._release(end), False

    def flush(self) -> str:
        """The text not yet released (at the end of the sequence)."""
        return self._release(len(self.text))

    def _release(self, end: int) -> str:
        if end <= self.sent:
            return ""
        delta = self.text[self.sent : end]
        self.sent = end
        return delta

    def _find_stop(self, text: str) -> int | None:
        found = [i for s in self.stops if (i := text.find(s, self.sent)) >= 0]
        return min(found) if found else None

    def _held(self, text: str) -> int:
        """Length of the longest end of ``text`` that starts some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


def unpack_bitmask(bitmask: Array, vocab: int) -> torch.Tensor:
    """llguidance's int32 bitmask rows ``[n, ceil(V/32)]`` as a bool tensor ``[n, vocab]``."""
    import numpy as np

    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")
    out = torch.zeros((bits.shape[0], vocab), dtype=torch.bool)
    width = min(vocab, bits.shape[1])
    out[:, :width] = torch.from_numpy(bits[:, :width].astype(bool))
    return out
