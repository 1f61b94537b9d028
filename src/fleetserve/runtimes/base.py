"""The Runtime protocol: what a model family needs from an inference engine.

A runtime loads a transformer checkpoint with one *head* and runs padded batches,
returning one named *output*. Families own pre- and postprocessing; runtimes own
weights, device, precision and the reductions that are best done on the device
(pooling, SPLADE's max over tokens), so that only small arrays cross to numpy.

Generation has a protocol of its own, :class:`GeneratingRuntime`, for runtimes that
generate whole sequences themselves (the external bridge). With the torch runtime the
generation family loads the model and runs its own engine, at the runtime's device and
precision and under its autocast (:class:`Autocasting`). Families that run the module
a runtime loaded (the image family) see it as a :class:`ModuleRuntime`.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..wire.values import Array


class Head(enum.StrEnum):
    """Which transformers model class a checkpoint is loaded as."""

    BASE = "base"  # AutoModel: last_hidden_state
    MASKED_LM = "masked_lm"  # AutoModelForMaskedLM: vocabulary logits (SPLADE)
    SEQUENCE_CLASSIFICATION = "sequence_classification"  # cross-encoders, NLI
    TOKEN_CLASSIFICATION = "token_classification"  # BIO NER


class Output(enum.StrEnum):
    """What ``Runtime.run`` returns, always float32."""

    MEAN = "mean"  # [batch, dim]: masked mean of the last hidden state
    CLS = "cls"  # [batch, dim]: the first token's hidden state
    HIDDEN = "hidden"  # [batch, seq, dim]: the last hidden state
    LOGITS = "logits"  # the head's logits: [batch, classes] or [batch, seq, classes]
    SPLADE = "splade"  # [batch, vocab]: max over tokens of log(1 + relu(logits)) * mask


@runtime_checkable
class Runtime(Protocol):
    """Loads weights and runs forward passes. One instance per (model, device).

    Call ``run`` from one dedicated thread (the worker's forward thread).
    """

    name: str
    device: str
    precision: str

    def load(self, path: Path, head: Head = Head.BASE) -> None:
        """Load a checkpoint from a local directory with the given head."""
        ...

    def run(
        self,
        input_ids: Array,
        attention_mask: Array,
        output: Output,
        token_type_ids: Array | None = None,
    ) -> Array:
        """One padded batch (int64 ``[batch, seq]`` arrays); returns ``output`` as float32."""
        ...

    def memory_bytes(self) -> int:
        """Bytes held by the loaded weights."""
        ...


@runtime_checkable
class Autocasting(Protocol):
    """A runtime whose precision families may run their own modules under (the torch
    runtime: bf16 autocast on CPU, a null context elsewhere)."""

    def autocast(self) -> contextlib.AbstractContextManager[None]: ...


@runtime_checkable
class ModuleRuntime(Runtime, Autocasting, Protocol):
    """A runtime that lends its loaded ``torch.nn.Module`` (the torch runtime), for
    families that need more than ``run`` (the image family's two towers)."""

    @property
    def model(self) -> Any:
        """The loaded module; raises before ``load``."""
        ...


@runtime_checkable
class Sleeps(Protocol):
    """A runtime whose loaded model can sleep: its weights leave the process's memory
    while a host-side copy stays (a mapped file the page cache holds), and it wakes
    without reading, parsing or converting anything (``mapped.py``)."""

    def prepare_sleep(self) -> int:
        """Run on a mapped copy of the weights from now on (written once per weights);
        the bytes a sleep would let go, 0 where it cannot sleep (on the loader thread,
        after ``load``)."""
        ...

    def sleep(self) -> int:
        """Let the weights' memory go; the bytes let go (0: it could not, and stays as
        it was)."""
        ...

    def wake(self) -> None:
        """Bring the weights back into memory, ahead of the next batch."""
        ...


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one sequence (the generation family's and the external runtime's)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    json_schema: dict[str, object] | None = None  # constrain the output to this JSON schema


@dataclass(slots=True)
class Generation:
    """One finished sequence."""

    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


@runtime_checkable
class GeneratingRuntime(Protocol):
    """A runtime that generates whole sequences itself: the external bridge to SGLang or
    vLLM. The generation family keeps the tokenizer and sends token ids; the server
    samples, batches and stops. ``generate`` is synchronous and thread-safe: the
    generation runner calls it from one thread per sequence."""

    def generate(
        self,
        input_ids: list[int],
        params: SamplingParams,
        on_text: Callable[[str], None] | None = None,
    ) -> Generation:
        """One sequence; streams text deltas to ``on_text`` when it is given."""
        ...


@runtime_checkable
class BatchGeneratingRuntime(GeneratingRuntime, Protocol):
    """A generating runtime that also takes many sequences at once (for the plain
    runner's ``forward``, which runs a batch to the end)."""

    def generate_batch(
        self, requests: Sequence[tuple[list[int], SamplingParams]]
    ) -> list[Generation]:
        """Many sequences, sent concurrently; results in input order."""
        ...
