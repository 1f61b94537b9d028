"""Training a LoRA adapter from question-passage pairs (a fine-tuning job's core).

:func:`train` (an embedder) and :func:`train_reranker` (a cross-encoder) run in the
calling process; :func:`train_in_child` runs either, as the spec's ``kind`` says, in a
child process of its own (own torch threads, lower priority, cancellable). The figures
are nDCG@10 and recall@10 of the base and the adapter on the held-out pairs
(:mod:`.ireval`): an embedder's retrieval, a reranker's order of the candidates a
bi-encoder retrieved. Hard negatives are mined with the base model, or for a reranker
with that bi-encoder (:mod:`.mining`). torch,
sentence-transformers, PEFT, datasets and pytrec_eval are imported only when used.
"""

from __future__ import annotations

from .checkpoint import CheckpointMismatch
from .child import train_in_child
from .errors import OutOfMemory
from .ireval import EvalSet, Scores, build_eval_set, evaluate
from .mining import mine, negatives_for
from .rerank import train_reranker
from .spec import EMBED, RERANK, Miner, TrainResult, TrainSpec, spec_fingerprint
from .trainer import train

__all__ = [
    "EMBED",
    "RERANK",
    "CheckpointMismatch",
    "EvalSet",
    "Miner",
    "OutOfMemory",
    "Scores",
    "TrainResult",
    "TrainSpec",
    "build_eval_set",
    "evaluate",
    "mine",
    "negatives_for",
    "spec_fingerprint",
    "train",
    "train_in_child",
    "train_reranker",
]
