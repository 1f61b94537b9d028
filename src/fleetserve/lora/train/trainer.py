"""Train a LoRA on a dense base model from question-passage pairs.

:func:`train` builds the sentence-transformers model that computes what fleetserve
serves (the base's last hidden state, the spec's pooling, L2 normalisation if the
spec normalizes), measures it on the held-out pairs, mines hard negatives with it,
wraps its transformer in a PEFT LoRA and trains with sentence-transformers' trainer
and MultipleNegativesRankingLoss (in-batch negatives plus the hard ones). It returns
the adapter as PEFT writes it (``adapter_config.json``, ``adapter_model.safetensors``)
with the figures of the base and the adapter.

Checkpoints, one per epoch, hold the LoRA weights only (kilobytes to a few MB), the
epoch and a fingerprint of the spec, so a job redelivered to another worker resumes
from its last finished epoch and a checkpoint of another job is refused.
"""

from __future__ import annotations

import contextlib
import importlib
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ...wire import InvalidInput
from ...wire.finetune import Hyperparameters
from ..validate import CONFIG, WEIGHTS
from .checkpoint import (
    CheckpointMismatch,
    load_lora,
    read_checkpoint,
    write_checkpoint,
)
from .ireval import INSTALL, Scores, build_eval_set, evaluate
from .mining import pairs_negatives
from .share import Fit, Watch, encode_batch, encoding_cost, fit
from .spec import EMBED, TrainResult, TrainSpec, spec_fingerprint

if TYPE_CHECKING:  # optional: annotations only
    import numpy as np
    import torch
    from numpy.typing import NDArray
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.model import BaseModel

Report = Callable[[str, dict[str, Any]], None]
POOLINGS = ("mean", "cls")  # fleetserve's spellings, which are sentence-transformers' too
BERT_TARGETS = ("query", "key", "value", "dense")
ENCODE_BATCH = 64


def train(spec: TrainSpec, report: Report, scratch: Path | None = None) -> TrainResult:
    """Train ``spec``; ``report(kind, data)`` gets ``status`` ({message}: loading,
    measuring the base, mining, training, measuring the adapter), ``progress``
    ({step, steps, epoch, loss}, every step) and ``checkpoint`` ({epoch, blob}, every
    epoch). With ``spec.resume``, the LoRA weights of that checkpoint are loaded and
    only the remaining epochs run, with a fresh optimizer and learning-rate schedule
    (warm-up included) over those: the optimizer state is not checkpointed, which
    keeps checkpoints small. Uses ``spec.threads`` torch threads (process-wide).
    ``scratch``: the trainer's output directory (it writes nothing there, but makes it),
    which the caller removes; None: a temporary one."""
    check_spec(spec)
    watch = Watch()  # what the run grows by, from here
    fingerprint = spec_fingerprint(spec)
    start, resumed = (0, None) if spec.resume is None else read_checkpoint(spec.resume, fingerprint)
    if not 0 <= start <= spec.hyperparameters.epochs:
        raise CheckpointMismatch(f"the checkpoint is of epoch {start}, not one of this run's")
    report("status", {"message": "loading the base model"})
    libraries().set_num_threads(spec.threads)
    from transformers import set_seed

    set_seed(spec.seed)
    hp = spec.hyperparameters
    model = build_model(spec)
    share, per_text = spec.memory_share, 0
    if share > 0:  # the share bounds the encoding batches too, by what is left of it
        per_text = encoding_cost(model, watch)

    def batch() -> int:
        return encode_batch(share, per_text, ENCODE_BATCH, watch) if share else ENCODE_BATCH

    report("status", {"message": "measuring the base model"})
    es = build_eval_set(spec.train, spec.validation)
    passages = _encode(model, es.passages, batch())
    base = evaluate(_encode(model, es.queries, batch()), passages, es.relevant)
    negatives = pairs_negatives(
        spec.train, hp.hard_negatives, es.passages, passages,
        lambda texts: _encode(model, texts, batch()),
        lambda: report("status", {"message": "mining hard negatives with the base model"}),
    )  # fmt: skip
    lora = add_lora(model, hp)
    if resumed is not None:
        load_lora(lora, resumed)
    remaining = hp.epochs - start
    steps, seconds = 0, 0.0
    fitted: Fit | None = None
    if remaining > 0:
        if spec.memory_share > 0:
            fitted = fit(model, spec.memory_share, hp.batch_size, spec.max_seq_len, watch)
            report("status", {"message": fitted.describe(hp.batch_size, spec.max_seq_len)})
        report("status", {"message": f"training on {len(spec.train)} pairs", "epochs": remaining})
        t0 = time.perf_counter()
        with scratch_dir(scratch) as out:
            steps = _fit(spec, model, lora, negatives.rows, remaining, start, fingerprint, out,
                         report, fitted)  # fmt: skip
        seconds = time.perf_counter() - t0
        model.max_seq_length = spec.max_seq_len  # measured as served
    report("status", {"message": "measuring the adapter"})
    adapter = evaluate(
        _encode(model, es.queries, batch()), _encode(model, es.passages, batch()), es.relevant
    )
    return result_of(spec, lora, (base, adapter), seconds, steps, start, negatives.mined,
                     watch, fitted)  # fmt: skip


def result_of(
    spec: TrainSpec,
    lora: PeftModel,
    scores: tuple[Scores, Scores],
    seconds: float,
    steps: int,
    start: int,
    mined: int,
    watch: Watch,
    fitted: Fit | None,
) -> TrainResult:
    """A run's result: the adapter's files as PEFT writes them, the ``scores`` of the
    base and the adapter, and what the run took (its memory within ``fitted``)."""
    config, weights = save_files(lora)
    memory = {"peak_growth": watch.peak_growth()}
    if fitted is not None:
        memory |= {"share": fitted.share, "micro_batch": fitted.micro_batch,
                   "max_seq_len": fitted.max_seq_len}  # fmt: skip
    base, adapter = scores
    return TrainResult(
        config, weights, base, adapter, seconds, steps, spec.hyperparameters.epochs, start,
        len(spec.train), mined, memory,
    )  # fmt: skip


def check_spec(spec: TrainSpec) -> None:
    """What any run needs: pairs to train on and to measure with, a base here; an
    embedder, a pooling it can train for."""
    if spec.kind == EMBED and spec.pooling not in POOLINGS:
        raise InvalidInput(
            f"a LoRA can be trained for mean or cls pooling, not {spec.pooling!r}", field="model"
        )
    if not spec.train:
        raise InvalidInput("no training pairs", field="training_file")
    if not spec.validation:
        raise InvalidInput("no validation pairs", field="validation_file")
    if spec.threads < 1 or spec.max_seq_len < 1:
        raise ValueError("threads and max_seq_len must be at least 1")
    if not Path(spec.base_path).is_dir():
        raise FileNotFoundError(f"base model directory {spec.base_path} does not exist")


def libraries() -> ModuleType:
    """torch, once sentence-transformers, PEFT and datasets are known to be there."""
    try:
        importlib.import_module("datasets")
        import peft  # noqa: F401
        import sentence_transformers  # noqa: F401
        import torch
    except ImportError as exc:
        raise RuntimeError(f"training needs {exc.name}: {INSTALL}") from exc
    return torch


def build_model(spec: TrainSpec) -> SentenceTransformer:
    """The dense base as a SentenceTransformer (:func:`bi_encoder`)."""
    return bi_encoder(spec.base_path, spec.pooling, spec.normalize, spec.max_seq_len)


def bi_encoder(path: str, pooling: str, normalize: bool, max_seq_len: int) -> SentenceTransformer:
    """A SentenceTransformer of the model at ``path`` at fp32: Transformer (truncating at
    ``max_seq_len``), the served spec's pooling, then Normalize if it normalizes. The
    directory's own ``modules.json``, if any, is not used: the spec decides."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(
        path, max_seq_length=max_seq_len, model_kwargs={"dtype": torch.float32}
    )
    modules: list[Any] = [transformer, Pooling(transformer.get_embedding_dimension(), pooling)]
    if normalize:
        modules.append(Normalize())
    return SentenceTransformer(modules=modules, device="cpu")


def lora_targets(
    hf_model: torch.nn.Module, pooler: bool = False
) -> tuple[list[str] | str, list[str]]:
    """BERT's attention and feed-forward Linear layers by name when it has them, else
    PEFT's ``all-linear``; and the Linear layers of a pooler to leave out (an
    embedder's: its output is not the served embedding, so they would get no gradient),
    unless ``pooler`` (a cross-encoder's head reads it)."""
    import torch

    linear = [n for n, m in hf_model.named_modules() if isinstance(m, torch.nn.Linear)]
    exclude = [] if pooler else [n for n in linear if "pooler" in n.split(".")]
    leaves = {n.rsplit(".", 1)[-1] for n in linear if n not in exclude}
    return (list(BERT_TARGETS) if set(BERT_TARGETS) <= leaves else "all-linear"), exclude


def add_lora(model: BaseModel, hp: Hyperparameters, pooler: bool = False) -> PeftModel:
    """Wrap ``model``'s transformer (``model[0].model``: a bi- or cross-encoder's) in a
    PEFT LoRA and return the PEFT model (``pooler``: :func:`lora_targets`).
    (sentence-transformers' own ``add_adapter`` needs a newer PEFT.)"""
    import torch
    from peft import LoraConfig, get_peft_model

    hf_model = model[0].model
    assert isinstance(hf_model, torch.nn.Module)  # the Transformer module's model
    targets, exclude = lora_targets(hf_model, pooler)
    alpha: Any = int(hp.alpha) if hp.alpha.is_integer() else hp.alpha  # PEFT types it int
    config = LoraConfig(
        r=hp.rank,
        lora_alpha=alpha,
        target_modules=targets,
        exclude_modules=exclude or None,
        lora_dropout=0.0,
    )
    with warnings.catch_warnings():  # PEFT calls a transformers API deprecated in v5
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        lora = get_peft_model(hf_model, config)
    model[0].model = lora
    return lora


def _encode(model: SentenceTransformer, texts: list[str], batch: int) -> NDArray[np.float32]:
    return model.encode(texts, batch_size=batch, convert_to_numpy=True, show_progress_bar=False)


def _fit(
    spec: TrainSpec,
    model: SentenceTransformer,
    lora: PeftModel,
    negatives: list[list[str]],
    epochs: int,
    start: int,
    fingerprint: str,
    out: str,
    report: Report,
    fitted: Fit | None = None,
) -> int:
    """Run sentence-transformers' trainer for ``epochs`` epochs (``out``: its output
    directory), within ``fitted`` where given; the steps taken."""
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )
    from sentence_transformers.sentence_transformer.training_args import (
        SentenceTransformerTrainingArguments,
    )

    columns: dict[str, list[Any]] = {
        "anchor": [p.query for p in spec.train],
        "positive": [p.positive for p in spec.train],
    }
    for c in range(len(negatives[0]) if negatives else 0):
        columns[f"negative_{c + 1}"] = [row[c] for row in negatives]
    hp = spec.hyperparameters
    loss: Any = MultipleNegativesRankingLoss(model)
    if fitted is not None:
        model.max_seq_length = fitted.max_seq_len
        if fitted.micro_batch < hp.batch_size:  # the same loss, a micro-batch at a time
            loss = CachedMultipleNegativesRankingLoss(model, mini_batch_size=fitted.micro_batch)
    args = SentenceTransformerTrainingArguments(
        **trainer_args(spec, epochs, start, out),
        per_device_train_batch_size=hp.batch_size,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
    )
    callback = progress_callback(report, lora, start, epochs, fingerprint)
    return run_trainer(SentenceTransformerTrainer, model, args, columns, loss, callback)


def trainer_args(spec: TrainSpec, epochs: int, start: int, out: str) -> dict[str, Any]:
    """The training arguments both trainers share (``out``: their output directory)."""
    return {
        "output_dir": out,
        "num_train_epochs": epochs,
        "learning_rate": spec.hyperparameters.learning_rate,
        "warmup_steps": 0.1,  # a fraction of the steps (transformers v5)
        "seed": spec.seed + start,  # a resumed run does not replay epoch 1's order
        "save_strategy": "no",
        "logging_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def run_trainer(
    trainer_cls: Any, model: Any, args: Any, columns: dict[str, list[Any]], loss: Any,
    callback: Any,
) -> int:  # fmt: skip
    """Train with ``trainer_cls`` (a sentence-transformers trainer) on ``columns``,
    quietly and without a model card; the optimizer steps taken."""
    dataset_cls = importlib.import_module("datasets").Dataset  # untyped: Any
    from transformers.trainer_callback import PrinterCallback

    class Trainer(trainer_cls):  # type: ignore[misc]
        def add_model_card_callback(self, default_args_dict: dict[str, object]) -> None:
            """No model card: it is not published, and its dataset statistics cost time."""

    trainer = Trainer(
        model=model, args=args, train_dataset=dataset_cls.from_dict(columns), loss=loss,
        callbacks=[callback],
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # it prints every log line to stdout
    trainer.train()
    return int(trainer.state.global_step)


@contextlib.contextmanager
def scratch_dir(given: Path | None) -> Iterator[str]:
    """``given`` (its caller removes it), else a temporary directory."""
    if given is not None:
        yield str(given)
        return
    with tempfile.TemporaryDirectory(prefix="fleetserve-train-") as out:
        yield out


def progress_callback(
    report: Report, lora: PeftModel, start: int, epochs: int, fingerprint: str
) -> Any:
    """A TrainerCallback reporting each logged step (the trainer logs every step) and a
    checkpoint at each epoch's end; steps and epochs count from the job's start, so a
    resumed run goes on where the last one stopped."""
    from peft import get_peft_model_state_dict
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        per_epoch = 1

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.per_epoch = max(1, int(state.max_steps) // epochs)

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if not logs or "loss" not in logs:
                return
            offset = start * self.per_epoch
            report(
                "progress",
                {
                    "step": offset + int(state.global_step),
                    "steps": offset + int(state.max_steps),
                    "epoch": round(start + float(state.epoch or 0.0), 4),
                    "loss": float(logs["loss"]),
                },
            )

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            epoch = start + round(float(state.epoch or 0.0))
            lora_state = get_peft_model_state_dict(lora, save_embedding_layers=False)
            blob = write_checkpoint(lora_state, epoch, fingerprint)
            report("checkpoint", {"epoch": epoch, "blob": blob})

    return Progress()


def save_files(lora: PeftModel) -> tuple[bytes, bytes]:
    """``adapter_config.json`` and ``adapter_model.safetensors`` exactly as PEFT's
    ``save_pretrained`` writes them."""
    with tempfile.TemporaryDirectory(prefix="fleetserve-adapter-") as out:
        lora.save_pretrained(out)
        return (Path(out) / CONFIG).read_bytes(), (Path(out) / WEIGHTS).read_bytes()
