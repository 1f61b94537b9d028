from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from fleetserve.lora.shapes import linear_shapes
from fleetserve.lora.train import CheckpointMismatch, TrainResult, TrainSpec, train
from fleetserve.lora.train.checkpoint import read_checkpoint
from fleetserve.lora.train.trainer import build_model, spec_fingerprint
from fleetserve.lora.validate import Limits, validate
from fleetserve.wire import InvalidInput
from fleetserve.wire.finetune import Hyperparameters
from tests.extras import TRAIN, needs
from tests.lora.train import Events, keeping_threads, synthetic_pairs, tiny_spec
from tests.tinymodels import build_bert

pytestmark = [needs(*TRAIN, extra="train"), pytest.mark.usefixtures("torch_threads")]


@dataclass(frozen=True)
class Run:
    base: Path
    spec: TrainSpec
    result: TrainResult
    events: Events


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    base = build_bert(tmp_path_factory.mktemp("train") / "bert")
    spec, events = tiny_spec(base), Events()
    with keeping_threads():
        result = train(spec, events)
    return Run(base, spec, result, events)


def checkpoint(run: Run, epoch: int) -> bytes:
    blobs = {d["epoch"]: d["blob"] for d in run.events.of("checkpoint")}
    return blobs[epoch]


def test_the_adapter_validates_against_its_base(run: Run) -> None:
    r = run.result
    manifest = validate(
        r.config,
        r.weights,
        ["adapter_config.json", "adapter_model.safetensors"],
        base_model="tiny/bert",
        base_shapes=linear_shapes(run.base),
        limits=Limits(),
    )
    assert manifest.rank == 4 and manifest.alpha == 8.0 and manifest.dtype == "F32"
    config = json.loads(r.config)
    assert sorted(config["target_modules"]) == ["dense", "key", "query", "value"]
    assert not any("pooler" in m for m in manifest.target_modules)
    assert len(manifest.modules) == 2 * 6  # two layers: query, key, value and three dense


def test_figures_and_counts(run: Run) -> None:
    r = run.result
    for s in (r.base, r.adapter):
        assert 0.0 <= s.ndcg_at_10 <= 1.0 and 0.0 <= s.recall_at_10 <= 1.0
    from safetensors.numpy import load

    b = [t for name, t in load(r.weights).items() if ".lora_B." in name]
    assert b and any(np.abs(t).max() > 0 for t in b)  # it trained: B starts at zero
    assert (r.steps, r.epochs, r.resumed_from_epoch, r.pairs) == (10, 2, 0, 40)
    assert r.mined_negatives == 32  # one each for the 32 pairs that bring none
    assert r.train_seconds > 0


def test_events_arrive_in_order(run: Run) -> None:
    ev = run.events
    assert ev.seen[:2] == [
        ("status", {"message": "loading the base model"}),
        ("status", {"message": "measuring the base model"}),
    ]
    progress = ev.of("progress")
    assert [p["step"] for p in progress] == list(range(1, 11))
    assert {p["steps"] for p in progress} == {10}
    assert progress[4]["epoch"] == pytest.approx(1.0) and progress[-1]["epoch"] == 2.0
    assert all(np.isfinite(p["loss"]) for p in progress)
    kinds = [k for k, _ in ev.seen]
    assert kinds.index("checkpoint") == kinds.index("progress") + 5  # after epoch 1's steps
    assert [c["epoch"] for c in ev.of("checkpoint")] == [1, 2]


def test_checkpoints_hold_lora_weights_only(run: Run) -> None:
    from safetensors.torch import load

    blob = checkpoint(run, 1)
    assert len(blob) < 64 * 1024
    tensors = load(blob)
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)
    epoch, state = read_checkpoint(blob, spec_fingerprint(run.spec))
    assert epoch == 1 and state.keys() == tensors.keys()


def test_resume_trains_only_the_remaining_epochs(run: Run) -> None:
    events = Events()
    r = train(replace(run.spec, resume=checkpoint(run, 1)), events)
    assert (r.resumed_from_epoch, r.steps, r.epochs) == (1, 5, 2)
    assert [p["step"] for p in events.of("progress")] == list(range(6, 11))
    assert events.of("progress")[0]["epoch"] == pytest.approx(1.2)
    assert [c["epoch"] for c in events.of("checkpoint")] == [2]
    validate(
        r.config, r.weights, base_model="b", base_shapes=linear_shapes(run.base), limits=Limits()
    )


def test_resuming_a_finished_run_returns_its_adapter(run: Run) -> None:
    events = Events()
    r = train(replace(run.spec, resume=checkpoint(run, 2)), events)
    assert (r.resumed_from_epoch, r.steps) == (2, 0)
    assert not events.of("progress")
    assert r.weights == run.result.weights  # the checkpoint holds the trained weights
    assert r.adapter == run.result.adapter


def test_a_checkpoint_of_another_spec_is_refused(run: Run, tmp_path: Path) -> None:
    blob = checkpoint(run, 1)
    others = [
        replace(run.spec, seed=1),
        replace(run.spec, train=run.spec.train[:-1]),
        replace(run.spec, hyperparameters=Hyperparameters(rank=8, epochs=2)),
        replace(run.spec, base_path=str(build_bert(tmp_path / "other", seed=1))),
    ]
    for spec in others:
        with pytest.raises(CheckpointMismatch, match="another training spec"):
            train(replace(spec, resume=blob), Events())
    with pytest.raises(CheckpointMismatch, match="not a training checkpoint"):
        train(replace(run.spec, resume=b"\x00garbage"), Events())
    # the same base copied elsewhere is the same spec
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in run.base.iterdir():
        (moved / f.name).write_bytes(f.read_bytes())
    assert spec_fingerprint(replace(run.spec, base_path=str(moved))) == spec_fingerprint(run.spec)


def test_without_hard_negatives(run: Run) -> None:
    pairs = synthetic_pairs(30, seed=3)
    plain = tuple(replace(p, negatives=()) for p in pairs)
    hp = Hyperparameters(rank=2, alpha=4.0, epochs=1, batch_size=8, hard_negatives=0)
    spec = replace(run.spec, train=plain[:24], validation=plain[24:], hyperparameters=hp)
    events = Events()
    r = train(spec, events)
    assert (r.mined_negatives, r.steps, r.pairs) == (0, 3, 24)
    assert not any("mining" in d["message"] for d in events.of("status"))


def test_spec_errors(run: Run, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="mean or cls") as exc:
        train(replace(run.spec, pooling="none"), Events())
    assert exc.value.field == "model"
    with pytest.raises(InvalidInput, match="validation"):
        train(replace(run.spec, validation=()), Events())
    with pytest.raises(FileNotFoundError, match="nowhere"):
        train(replace(run.spec, base_path=str(tmp_path / "nowhere")), Events())


@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("normalize", [True, False])
def test_the_model_computes_the_served_embedding(run: Run, pooling: str, normalize: bool) -> None:
    """The trained embedding is the served one: the base's last hidden state pooled as
    the spec says (runtimes/torch.py's reduction), normalized if it says so."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    spec = replace(run.spec, pooling=pooling, normalize=normalize)
    texts = ["hello world", "the quick brown fox jumps over the lazy dog again and again"]
    got = build_model(spec).encode(texts, convert_to_numpy=True, show_progress_bar=False)
    tok = AutoTokenizer.from_pretrained(str(run.base))
    hf = AutoModel.from_pretrained(str(run.base)).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        hidden = hf(**batch).last_hidden_state
    if pooling == "cls":
        want = hidden[:, 0]
    else:
        m = batch["attention_mask"].unsqueeze(-1).float()
        want = (hidden * m).sum(1) / m.sum(1)
    if normalize:
        want = torch.nn.functional.normalize(want, dim=-1)
    assert batch["input_ids"].shape[1] == 16  # the long text was truncated
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
