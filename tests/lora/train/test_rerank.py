"""A reranker's run: a LoRA on a tiny cross-encoder, its negatives mined and its
held-out candidates retrieved by a tiny bi-encoder (the miner)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from fleetserve.lora.shapes import linear_shapes
from fleetserve.lora.train import (
    EMBED,
    RERANK,
    CheckpointMismatch,
    EvalSet,
    Miner,
    TrainResult,
    TrainSpec,
    spec_fingerprint,
    train_reranker,
)
from fleetserve.lora.train.rerank import CANDIDATES, rerank
from fleetserve.lora.validate import Limits, validate
from fleetserve.wire import InvalidInput
from tests.extras import TRAIN, needs
from tests.lora.train import Events, keeping_threads, tiny_spec
from tests.tiny_rerank import build_cross_encoder
from tests.tinymodels import build_bert

pytestmark = [needs(*TRAIN, extra="train"), pytest.mark.usefixtures("torch_threads")]


@dataclass(frozen=True)
class Run:
    base: Path
    spec: TrainSpec
    result: TrainResult
    events: Events


def reranker_spec(root: Path) -> TrainSpec:
    """tiny_spec's pairs and hyperparameters (one negative a pair) on a cross-encoder."""
    base = build_cross_encoder(root / "cross-encoder")
    miner = build_bert(root / "bi-encoder")
    return replace(
        tiny_spec(base), kind=RERANK, pooling="cls", max_seq_len=32,
        miner=Miner(str(miner), "mean", True, 16),
    )  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    spec, events = reranker_spec(tmp_path_factory.mktemp("rerank")), Events()
    with keeping_threads():
        result = train_reranker(spec, events)
    return Run(Path(spec.base_path), spec, result, events)


def test_the_adapter_targets_the_encoder_and_the_pooler_not_the_head(run: Run) -> None:
    r = run.result
    manifest = validate(
        r.config, r.weights, ["adapter_config.json", "adapter_model.safetensors"],
        base_model="tiny/rerank", base_shapes=linear_shapes(run.base), limits=Limits(),
    )  # fmt: skip
    modules = {m.module for m in manifest.modules}
    assert "bert.pooler.dense" in modules  # the head reads the pooler's output
    assert not any(m.startswith("classifier") for m in modules)
    assert len(modules) == 2 * 6 + 1  # two layers: query, key, value, three dense; pooler
    assert json.loads(r.config)["r"] == 4


def test_figures_steps_and_mined_negatives(run: Run) -> None:
    r = run.result
    for s in (r.base, r.adapter):
        assert 0.0 <= s.ndcg_at_10 <= 1.0 and 0.0 <= s.recall_at_10 <= 1.0
    from safetensors.numpy import load

    b = [t for name, t in load(r.weights).items() if ".lora_B." in name]
    assert b and any(np.abs(t).max() > 0 for t in b)  # it trained: B starts at zero
    # 40 pairs, each a positive and one negative: 80 rows, batches of 8, 2 epochs
    assert (r.steps, r.epochs, r.pairs) == (20, 2, 40)
    assert r.mined_negatives == 32  # one each for the 32 pairs that bring none
    statuses = [d["message"] for d in run.events.of("status")]
    assert statuses == [
        "retrieving candidates with the miner", "mining hard negatives with the miner",
        "loading the base model", "measuring the base model", "training on 40 pairs",
        "measuring the adapter",
    ]  # fmt: skip
    assert [c["epoch"] for c in run.events.of("checkpoint")] == [1, 2]


def test_a_resumed_run_trains_the_rest_and_an_embedders_checkpoint_is_refused(run: Run) -> None:
    (first, *_) = (d["blob"] for d in run.events.of("checkpoint"))
    r = train_reranker(replace(run.spec, resume=first), Events())
    assert (r.resumed_from_epoch, r.steps) == (1, 10)
    embedder = replace(run.spec, kind=EMBED)  # the same files and pairs, another task
    assert spec_fingerprint(embedder) != spec_fingerprint(run.spec)
    assert run.spec.miner is not None
    other_miner = replace(run.spec, miner=replace(run.spec.miner, max_seq_len=8))
    assert spec_fingerprint(other_miner) != spec_fingerprint(run.spec)
    from fleetserve.lora.train.checkpoint import write_checkpoint

    foreign = write_checkpoint({}, 1, spec_fingerprint(embedder))
    with pytest.raises(CheckpointMismatch):
        train_reranker(replace(run.spec, resume=foreign), Events())


def test_pairs_without_negatives_and_none_mined_name_the_training_file(run: Run) -> None:
    bare = tuple(replace(p, negatives=()) for p in run.spec.train)
    hp = replace(run.spec.hyperparameters, hard_negatives=0)
    with pytest.raises(InvalidInput, match="give none") as err:
        train_reranker(replace(run.spec, train=bare, hyperparameters=hp), Events())
    assert err.value.field == "training_file"


def test_a_cross_encoder_of_two_labels_names_the_model(run: Run, tmp_path: Path) -> None:
    two = build_cross_encoder(tmp_path / "two", num_labels=2)
    with pytest.raises(InvalidInput, match="2 labels") as err:
        train_reranker(replace(run.spec, base_path=str(two)), Events())
    assert err.value.field == "model"


def test_the_measure_ranks_only_the_candidates() -> None:
    """A positive the miner did not retrieve counts as not found; the candidates are
    ranked by the reranker's scores."""

    class Scorer:
        def predict(self, pairs: list[tuple[str, str]], **_: object) -> np.ndarray:
            return np.array([float(len(d)) for _, d in pairs])  # longer ranks higher

    es = EvalSet(["q0", "q1"], ["a", "bbbb", "cc", "ddd"], [{1}, {0}])
    candidates = np.array([[0, 1, 2], [1, 2, 3]])  # q1's answer (0) was not retrieved
    scores = rerank(Scorer(), es, candidates, batch=8)  # type: ignore[arg-type]
    assert scores.recall_at_10 == 0.5 and scores.ndcg_at_10 == 0.5
    assert CANDIDATES >= 10  # nDCG@10 has ten places to fill


def test_an_embedder_spec_is_no_reranker(run: Run) -> None:
    with pytest.raises(ValueError, match="needs a miner"):
        train_reranker(replace(run.spec, miner=None), Events())
