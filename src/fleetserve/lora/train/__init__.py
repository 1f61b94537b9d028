"""Training a LoRA adapter from question-passage pairs (a fine-tuning job's core).

:func:`train` runs in the calling process; :func:`train_in_child` runs it in a child
process of its own (own torch threads, lower priority, cancellable). The figures are
nDCG@10 and recall@10 of the base and the adapter on the held-out pairs (:mod:`.ireval`);
hard negatives are mined with the base model (:mod:`.mining`). torch,
sentence-transformers, PEFT, datasets and pytrec_eval are imported only when used.
"""

from __future__ import annotations

from .checkpoint import CheckpointMismatch
from .child import train_in_child
from .errors import OutOfMemory
from .ireval import EvalSet, Scores, build_eval_set, evaluate
from .mining import mine, negatives_for
from .spec import TrainResult, TrainSpec, spec_fingerprint
from .trainer import train

__all__ = [
    "CheckpointMismatch",
    "EvalSet",
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
]
