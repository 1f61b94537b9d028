"""Train a LoRA on a cross-encoder base (a reranker) from question-passage pairs.

:func:`train_reranker` first loads the miner, the bi-encoder the fleet retrieves with
(``TrainSpec.miner``, built as :func:`~.trainer.bi_encoder` builds a dense base). It
encodes every passage the job has seen and the held-out queries: each held-out query's
candidates are the miner's top ``CANDIDATES`` passages, the list a reranker reorders
in a retrieve-then-rerank search. Pairs that bring fewer negatives than asked get the
miner's hard negatives (``mining.py``, as for an embedder). The miner is then let go.

The base loads as sentence-transformers' CrossEncoder at fp32, each (query, passage)
cut to the spec's ``max_seq_len``. It reranks the candidates, then the adapter does:
nDCG@10 and recall@10 of those orders (pytrec_eval); a positive the miner did not
retrieve counts as not found, for both alike. Only a one-label cross-encoder (a
relevance score) trains; its scores' activation keeps the order, so the logits rank.

Training: a PEFT LoRA on the encoder's Linear layers and its pooler (the head reads
the pooler's output; the head itself stays the base's), sentence-transformers'
CrossEncoderTrainer and BinaryCrossEntropyLoss over (query, passage, label) rows: each
positive 1, each negative 0, the positives weighted by the negatives per pair so that
the two classes weigh alike (sentence-transformers' recipe for rerankers). Within a
memory share, a batch runs as micro-batches by gradient accumulation. Checkpoints,
events and the result are an embedder's (``trainer.py``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...wire import InvalidInput
from .checkpoint import CheckpointMismatch, load_lora, read_checkpoint
from .ireval import EvalSet, Scores, build_eval_set, evaluate_run, top_k, unit_rows
from .mining import Negatives, pairs_negatives
from .share import Fit, Watch, encode_batch, encoding_cost, fit
from .spec import TrainResult, TrainSpec, spec_fingerprint
from .trainer import (
    ENCODE_BATCH,
    Report,
    add_lora,
    bi_encoder,
    check_spec,
    libraries,
    progress_callback,
    result_of,
    run_trainer,
    scratch_dir,
    trainer_args,
)

if TYPE_CHECKING:  # optional: annotations only
    import numpy as np
    from numpy.typing import NDArray
    from peft import PeftModel
    from sentence_transformers.cross_encoder import CrossEncoder

CANDIDATES = 30  # the miner's passages per held-out query that the reranker reorders


def train_reranker(spec: TrainSpec, report: Report, scratch: Path | None = None) -> TrainResult:
    """Train ``spec`` (``kind`` ``RERANK``); events, checkpoints, resuming, threads and
    ``scratch`` as :func:`~.trainer.train` says."""
    check_spec(spec)
    if spec.miner is None:
        raise ValueError("a reranker's run needs a miner, the bi-encoder that retrieves")
    watch = Watch()
    fingerprint = spec_fingerprint(spec)
    start, resumed = (0, None) if spec.resume is None else read_checkpoint(spec.resume, fingerprint)
    if not 0 <= start <= spec.hyperparameters.epochs:
        raise CheckpointMismatch(f"the checkpoint is of epoch {start}, not one of this run's")
    hp = spec.hyperparameters
    report("status", {"message": "retrieving candidates with the miner"})
    libraries().set_num_threads(spec.threads)
    from transformers import set_seed

    set_seed(spec.seed)
    es = build_eval_set(spec.train, spec.validation)
    candidates, negatives = _retrieve(spec, es, watch, report)
    if negatives.columns == 0:
        raise InvalidInput(
            "a reranker learns to tell a query's answer from other passages, and these pairs "
            "give none: add negatives to the pairs, or set hyperparameters.hard_negatives",
            field="training_file",
        )
    report("status", {"message": "loading the base model"})
    model = cross_encoder(spec)
    share, per_pair = spec.memory_share, 0
    if share > 0:
        per_pair = encoding_cost(model, watch)

    def batch() -> int:
        return encode_batch(share, per_pair, ENCODE_BATCH, watch) if share else ENCODE_BATCH

    report("status", {"message": "measuring the base model"})
    base = rerank(model, es, candidates, batch())
    lora = add_lora(model, hp, pooler=True)
    if resumed is not None:
        load_lora(lora, resumed)
    remaining = hp.epochs - start
    steps, seconds = 0, 0.0
    fitted: Fit | None = None
    if remaining > 0:
        if share > 0:
            fitted = fit(model, share, hp.batch_size, spec.max_seq_len, watch)
            report("status", {"message": fitted.describe(hp.batch_size, spec.max_seq_len)})
        report("status", {"message": f"training on {len(spec.train)} pairs", "epochs": remaining})
        t0 = time.perf_counter()
        with scratch_dir(scratch) as out:
            steps = _fit(spec, model, lora, negatives, remaining, start, fingerprint, out,
                         report, fitted)  # fmt: skip
        seconds = time.perf_counter() - t0
        model.max_seq_length = spec.max_seq_len  # measured as served
    report("status", {"message": "measuring the adapter"})
    adapter = rerank(model, es, candidates, batch())
    return result_of(spec, lora, (base, adapter), seconds, steps, start, negatives.mined,
                     watch, fitted)  # fmt: skip


def _retrieve(
    spec: TrainSpec, es: EvalSet, watch: Watch, report: Report
) -> tuple[NDArray[np.intp], Negatives]:
    """With the miner: each held-out query's candidates (indices into ``es.passages``)
    and every pair's negatives, its own first, then mined."""
    m = spec.miner
    assert m is not None
    miner = bi_encoder(m.path, m.pooling, m.normalize, m.max_seq_len)
    per_text = encoding_cost(miner, watch) if spec.memory_share > 0 else 0
    size = (
        encode_batch(spec.memory_share, per_text, ENCODE_BATCH, watch)
        if spec.memory_share
        else ENCODE_BATCH
    )

    def encode(texts: list[str]) -> NDArray[np.float32]:
        out: NDArray[np.float32] = miner.encode(
            texts, batch_size=size, convert_to_numpy=True, show_progress_bar=False
        )
        return out

    passages = encode(es.passages)
    candidates = top_k(unit_rows(encode(es.queries)) @ unit_rows(passages).T, CANDIDATES)
    negatives = pairs_negatives(
        spec.train,
        spec.hyperparameters.hard_negatives,
        es.passages,
        passages,
        encode,
        lambda: report("status", {"message": "mining hard negatives with the miner"}),
    )
    return candidates, negatives  # the miner goes with this frame


def cross_encoder(spec: TrainSpec) -> CrossEncoder:
    """The base as a CrossEncoder at fp32, pairs cut to the spec's ``max_seq_len``; an
    ``InvalidInput`` naming ``model`` unless it scores with one label."""
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    model: CrossEncoder = CrossEncoder(
        spec.base_path, device="cpu", max_length=spec.max_seq_len,
        model_kwargs={"dtype": torch.float32},
    )  # fmt: skip
    if model.num_labels != 1:
        raise InvalidInput(
            f"the base model scores with {model.num_labels} labels; a reranker's LoRA trains "
            "a cross-encoder with one (a relevance score)",
            field="model",
        )
    return model


def rerank(model: CrossEncoder, es: EvalSet, candidates: NDArray[np.intp], batch: int) -> Scores:
    """nDCG@10 and recall@10 of ``model``'s order of each held-out query's candidates."""
    pairs = [(es.queries[i], es.passages[int(j)]) for i, row in enumerate(candidates) for j in row]
    scores = model.predict(pairs, batch_size=batch, convert_to_numpy=True, show_progress_bar=False)
    run: list[dict[int, float]] = []
    at = 0
    for row in candidates:
        run.append({int(j): float(scores[at + n]) for n, j in enumerate(row)})
        at += len(row)
    return evaluate_run(run, es.relevant)


def _fit(
    spec: TrainSpec,
    model: CrossEncoder,
    lora: PeftModel,
    negatives: Negatives,
    epochs: int,
    start: int,
    fingerprint: str,
    out: str,
    report: Report,
    fitted: Fit | None = None,
) -> int:
    """sentence-transformers' CrossEncoderTrainer for ``epochs`` epochs with binary
    cross-entropy (``out``: its output directory), within ``fitted`` where given; the
    optimizer steps taken."""
    import torch
    from sentence_transformers.cross_encoder import (
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    columns: dict[str, list[Any]] = {"query": [], "passage": [], "label": []}
    for pair, row in zip(spec.train, negatives.rows, strict=True):
        for text, label in ((pair.positive, 1.0), *((n, 0.0) for n in row)):
            columns["query"].append(pair.query)
            columns["passage"].append(text)
            columns["label"].append(label)
    hp = spec.hyperparameters
    loss: Any = BinaryCrossEntropyLoss(
        model, pos_weight=torch.tensor(float(negatives.columns))
    )  # a positive weighs as much as its negatives together
    micro, accumulate = hp.batch_size, 1
    if fitted is not None:
        model.max_seq_length = fitted.max_seq_len
        if fitted.micro_batch < hp.batch_size:  # the same batch, a micro-batch at a time
            accumulate = math.ceil(hp.batch_size / fitted.micro_batch)
            micro = math.ceil(hp.batch_size / accumulate)
    args = CrossEncoderTrainingArguments(
        **trainer_args(spec, epochs, start, out),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulate,
    )
    callback = progress_callback(report, lora, start, epochs, fingerprint)
    return run_trainer(CrossEncoderTrainer, model, args, columns, loss, callback)


__all__ = ["CANDIDATES", "cross_encoder", "rerank", "train_reranker"]
