"""What a job trains: its pairs split into those it trains on and those it is measured
with, its base's weights here and, for a reranker (a cross-encoder base), its miner's,
as the ``TrainSpec`` a run takes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ...wire import InvalidInput
from ...wire.finetune import Job, Pair
from ..pairs import split_by_query
from ..train import EMBED, RERANK, Miner, TrainSpec
from .manager import RERANKER_FAMILY
from .store import JobStore


@dataclass(frozen=True)
class TrainBase:
    """What training needs of a base model: its weights here, how it pools, and its
    family (a ``cross_encoder`` trains as a reranker, with the runner's miner)."""

    path: str
    pooling: str
    normalize: bool
    max_seq_len: int
    family: str = "dense"


BaseOf = Callable[[str], Awaitable[TrainBase]]


async def train_spec(
    job: Job,
    store: JobStore,
    base_of: BaseOf,
    *,
    miner: str,
    threads: int,
    memory_share: int,
    resume: bytes | None,
    note: Callable[[str], None],
) -> TrainSpec:
    """``job``'s run: its base (and ``miner``, the catalog's bi-encoder, for a
    reranker) resolved by ``base_of``, its pairs read from ``store`` and split;
    ``note`` tells the job's feed what was decided."""
    base = await base_of(job.model)
    pairs = await store.pairs(job.tenant, job.training_file)
    if job.validation_file:
        validation = await store.pairs(job.tenant, job.validation_file)
        held = {p.query for p in validation}
        train: tuple[Pair, ...] = tuple(p for p in pairs if p.query not in held)
        if not train:
            raise InvalidInput("every training pair asks a validation query: nothing "
                               "is left to train on", field="validation_file")  # fmt: skip
        if len(train) < len(pairs):
            note(f"{len(pairs) - len(train)} training pairs ask a validation query; "
                 "left out of training")  # fmt: skip
    else:
        train, validation = await asyncio.to_thread(
            split_by_query, pairs, job.validation_fraction, seed=job.seed
        )
    note(f"{len(train)} pairs to train on, {len({p.query for p in validation})} "
         "held-out queries to measure with")  # fmt: skip
    kind, mines = EMBED, None
    if base.family == RERANKER_FAMILY:
        kind, mines = RERANK, await _miner(base_of, miner)
        note(f"a reranker: {miner} mines its negatives and retrieves the candidates it is "
             "measured on")  # fmt: skip
    return TrainSpec(
        base_path=base.path, pooling=base.pooling, normalize=base.normalize,
        max_seq_len=base.max_seq_len, train=train, validation=validation,
        hyperparameters=job.hyperparameters, threads=threads, seed=job.seed,
        resume=resume, memory_share=memory_share, kind=kind, miner=mines,
    )  # fmt: skip


async def _miner(base_of: BaseOf, miner: str) -> Miner:
    """The miner's weights here, and how it pools; an ``InvalidInput`` naming
    ``model`` (the job's base needs it) when it is not a dense model of the catalog
    with weights here."""
    try:
        m = await base_of(miner) if miner else None
    except InvalidInput as exc:
        raise InvalidInput(f"a reranker's job needs its miner (train_miner): "
                           f"{exc.message}", field="model") from None  # fmt: skip
    if m is None or m.family != "dense":
        raise InvalidInput(
            f"a reranker's job needs a dense bi-encoder to mine with; train_miner is "
            f"{miner!r}" + (f", a {m.family} model" if m is not None else ""),
            field="model",
        )
    return Miner(m.path, m.pooling, m.normalize, m.max_seq_len)


__all__ = ["BaseOf", "TrainBase", "train_spec"]
