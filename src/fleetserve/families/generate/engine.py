"""Continuous batching over a transformers causal LM with one batched KV cache.

Running sequences share one left-padded ``DynamicCache``: a decode step is one forward
pass of one new token per sequence, with an attention mask over the padded cache and
per-sequence position ids. Newcomers are prefilled between steps (together, left
padded), and their cache is padded and concatenated onto the running one; finished
sequences leave the cache at once, and columns that became padding for every row are
trimmed. Call ``step`` from one thread.

A prompt longer than ``prefill_chunk`` tokens is prefilled in chunks of that many, one
chunk a step (the oldest such prompt first), in a cache of its own, while the running
sequences go on decoding: a long prompt neither stalls the others for its whole
prefill nor runs on for long once cancelled (``Seq.cancelled`` is honoured at every
step, so between its chunks too).

Sequences may run different LoRA adapters of the model (``Seq.adapter``, made hot in
the ``bank`` beforehand): every forward pass plans each adapter's rows, so adapters
mix across the running sequences as they would across a batch.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from ...runtimes import SamplingParams
from .sampling import TextStream, choose, new_generator, unpack_bitmask

if TYPE_CHECKING:
    from ...lora.mixed import LoraBank

PREFILL_CHUNK = 512  # prompt tokens per forward pass when a long prompt is prefilled


class Seq:
    """One generated sequence: its prompt, sampling, constraint and progress."""

    def __init__(
        self,
        prompt: list[int],
        params: SamplingParams,
        stream: TextStream,
        *,
        matcher: Any = None,
        tag: Any = None,
        adapter: str | None = None,
    ) -> None:
        if not prompt:
            raise ValueError("a sequence needs at least one prompt token")
        self.prompt = prompt
        self.params = params
        self.stream = stream
        self.matcher = matcher  # an llguidance LLMatcher, or None
        self.tag = tag  # the owner's handle (the worker's job)
        self.adapter = adapter  # the LoRA adapter it runs (None: the base model)
        self.out: list[int] = []
        self.delta = ""  # text released during the last step
        self.finish_reason: str | None = None
        self.cancelled = False
        self.generator = new_generator(params.seed)
        self.pos = 0  # tokens of this sequence in the cache
        self.next = 0  # the last chosen token, fed at the next decode step

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.cancelled

    @property
    def text(self) -> str:
        return self.stream.text


class _Fill:
    """A long prompt being prefilled a chunk a step, in a cache of its own."""

    def __init__(self, seq: Seq, cache: Any) -> None:
        self.seq = seq
        self.cache = cache
        self.done = 0  # prompt tokens in its cache so far


class Engine:
    def __init__(
        self,
        model: Any,
        *,
        eos_ids: Iterable[int],
        vocab_size: int,
        device: str = "cpu",
        pad_id: int = 0,
        autocast: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
        bank: LoraBank | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
    ) -> None:
        if prefill_chunk < 1:
            raise ValueError("prefill_chunk must be at least 1")
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.bank = bank
        self.eos = frozenset(eos_ids)
        self.vocab = vocab_size
        self.device = device
        self.pad_id = pad_id
        self._autocast = autocast or contextlib.nullcontext
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.filling: list[_Fill] = []  # long prompts, prefilled a chunk a step
        self.steps = 0  # calls of ``step`` that ran a forward pass
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # [running, cache length], 1 = real token

    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and not self.filling

    @property
    def prefilling(self) -> list[Seq]:
        """The long prompts whose prefill is under way."""
        return [f.seq for f in self.filling]

    def reset(self) -> list[Seq]:
        """Drop every sequence (after a failed step); returns them."""
        dropped = [*self.running, *self.prefilling, *self.waiting]
        self.running, self.waiting, self.filling = [], deque(), []
        self._cache = self._mask = None
        return dropped

    def step(self) -> list[Seq]:
        """Prefill the newcomers (a long prompt by one chunk), decode one token for
        every running sequence, and drop the finished and the cancelled; returns the
        sequences with new text or a finish."""
        for s in [*self.running, *self.prefilling, *self.waiting]:
            s.delta = ""
        self.waiting = deque(s for s in self.waiting if not s.cancelled)
        self.filling = [f for f in self.filling if not f.seq.cancelled]  # its cache goes
        changed: list[Seq] = []
        if self.idle:
            return changed
        self.steps += 1
        with torch.inference_mode(), self._autocast():
            if self.waiting:
                fresh = sorted(self.waiting, key=lambda s: s.adapter or "")  # segments
                self.waiting.clear()
                short = [s for s in fresh if len(s.prompt) <= self.prefill_chunk]
                self.filling += [_Fill(s, _new_cache()) for s in fresh if s not in short]
                if short:
                    changed += self._prefill(short)
            if self.filling and self._advance(self.filling[0]):  # oldest first
                changed.append(self.filling.pop(0).seq)
            self._evict()
            if self.running:
                changed += self._decode()
            self._evict()
        seen: dict[int, Seq] = {}
        for s in changed:
            seen.setdefault(id(s), s)
        return list(seen.values())

    # -- forward passes -------------------------------------------------------------------
    def _prefill(self, seqs: list[Seq]) -> list[Seq]:
        width = max(len(s.prompt) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s.prompt) :] = torch.tensor(s.prompt)
            mask[i, width - len(s.prompt) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = _new_cache()
        with self._plan(seqs):
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=pos.to(self.device),
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        for s in seqs:
            s.pos = len(s.prompt)
        self._choose(seqs, out.logits[:, -1])
        self._merge(cache, mask.to(self.device), seqs)
        return seqs

    def _advance(self, f: _Fill) -> bool:
        """Prefill the next chunk of a long prompt; True when its prefill is done (it
        then has its first token and has joined the running sequences)."""
        s = f.seq
        end = min(f.done + self.prefill_chunk, len(s.prompt))
        ids = torch.tensor([s.prompt[f.done : end]], dtype=torch.long, device=self.device)
        pos = torch.arange(f.done, end, dtype=torch.long, device=self.device).unsqueeze(0)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        with self._plan([s]):
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                cache=f.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        f.done = end
        if end < len(s.prompt):
            return False
        s.pos = len(s.prompt)
        self._choose([s], out.logits[:, -1])
        self._merge(f.cache, mask, [s])
        return True

    def _decode(self) -> list[Seq]:
        seqs = self.running
        assert self._mask is not None
        ids = torch.tensor([[s.next] for s in seqs], dtype=torch.long, device=self.device)
        pos = torch.tensor([[s.pos] for s in seqs], dtype=torch.long, device=self.device)
        ones = torch.ones((len(seqs), 1), dtype=self._mask.dtype, device=self.device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        with self._plan(seqs):
            out = self.model(
                input_ids=ids,
                attention_mask=self._mask,
                position_ids=pos,
                cache=self._cache,
                use_cache=True,
            )
        for s in seqs:
            s.pos += 1
        self._choose(seqs, out.logits[:, -1])
        return list(seqs)

    def _plan(self, seqs: Sequence[Seq]) -> contextlib.AbstractContextManager[None]:
        """Each adapter's rows for one forward pass over ``seqs`` (in row order)."""
        keys = [s.adapter for s in seqs]
        if self.bank is None or not any(keys):
            return contextlib.nullcontext()
        from ...lora.mixed import segments_of

        return self.bank.plan(segments_of(keys), len(keys))

    # -- tokens ---------------------------------------------------------------------------
    def _choose(self, seqs: Sequence[Seq], logits: torch.Tensor) -> None:
        greedy = logits.argmax(-1).tolist()
        allowed = self._allowed(seqs, int(logits.shape[-1]))
        for i, s in enumerate(seqs):
            mask = allowed.get(i)
            if s.params.temperature <= 0.0 and mask is None:
                tok = int(greedy[i])
            else:
                tok = choose(logits[i], s.params.temperature, s.params.top_p, s.generator, mask)
            self._accept(s, tok)

    def _allowed(self, seqs: Sequence[Seq], width: int) -> dict[int, torch.Tensor]:
        """Per constrained row, the tokens its grammar allows (bool, ``width`` long)."""
        rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if not rows:
            return {}
        import llguidance.numpy as lln

        bitmask = lln.allocate_token_bitmask(len(rows), self.vocab)
        for k, i in enumerate(rows):
            lln.fill_next_token_bitmask(seqs[i].matcher, bitmask, k)
        masks = unpack_bitmask(bitmask, width)
        return {i: masks[k] for k, i in enumerate(rows)}

    def _accept(self, s: Seq, tok: int) -> None:
        s.next = tok
        s.out.append(tok)
        m = s.matcher
        if m is not None and not m.consume_token(tok):
            s.finish_reason = "stop"  # the grammar refused (it allowed nothing else)
        elif tok in self.eos:
            s.finish_reason = "stop"
        else:
            delta, stopped = s.stream.update([t for t in s.out if t not in self.eos])
            s.delta += delta
            if stopped or (m is not None and m.is_stopped()):
                s.finish_reason = "stop"
            elif len(s.out) >= s.params.max_tokens:
                s.finish_reason = "length"
        if s.finish_reason is not None:
            s.delta += s.stream.flush()

    # -- the shared cache -----------------------------------------------------------------
    def _merge(self, cache: Any, mask: torch.Tensor, seqs: list[Seq]) -> None:
        if not self.running:
            self._cache, self._mask, self.running = cache, mask, list(seqs)
            return
        assert self._mask is not None
        width = max(self._mask.shape[1], mask.shape[1])
        a, b = width - self._mask.shape[1], width - mask.shape[1]
        for old, new in zip(self._cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_lpad(old.keys, a), _lpad(new.keys, b)], dim=0)
            old.values = torch.cat([_lpad(old.values, a), _lpad(new.values, b)], dim=0)
        self._mask = torch.cat([F.pad(self._mask, (a, 0)), F.pad(mask, (b, 0))], dim=0)
        self.running += seqs

    def _evict(self) -> None:
        keep = [i for i, s in enumerate(self.running) if not s.done]
        if len(keep) == len(self.running):
            return
        if not keep:
            self.running, self._cache, self._mask = [], None, None
            return
        assert self._mask is not None
        idx = torch.tensor(keep, device=self.device)
        mask = self._mask[idx]
        start = int((mask.sum(0) > 0).nonzero()[0].item())  # columns padding in every row
        for layer in self._cache.layers:
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]
        self._mask = mask[:, start:]
        self.running = [self.running[i] for i in keep]


def _new_cache() -> Any:
    from transformers import DynamicCache

    return DynamicCache()


def _lpad(x: torch.Tensor, n: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2) of ``[batch, heads, seq, dim]`` with zeros."""
    return F.pad(x, (0, 0, n, 0)) if n else x
