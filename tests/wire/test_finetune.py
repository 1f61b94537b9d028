"""The fine-tuning records: hyperparameters checked by name, records that round-trip."""

from __future__ import annotations

import pytest

from fleetserve.wire import InvalidInput
from fleetserve.wire.finetune import (
    FileInfo,
    Hyperparameters,
    Job,
    JobEvent,
    JobStatus,
    check_suffix,
    new_id,
)


def test_defaults_aliases_and_auto() -> None:
    assert Hyperparameters.from_dict(None) == Hyperparameters()
    hp = Hyperparameters.from_dict({"rank": 8, "n_epochs": 2, "batch_size": "auto"})
    assert (hp.rank, hp.alpha, hp.epochs, hp.batch_size) == (8, 16.0, 2, 32)
    assert Hyperparameters.from_dict({"rank": 8, "alpha": 8}).alpha == 8.0
    assert Hyperparameters.from_dict(hp.to_dict()) == hp and hp.to_dict()["n_epochs"] == 2
    openai = Hyperparameters.from_dict({"learning_rate_multiplier": 2, "n_epochs": "auto"})
    assert openai.learning_rate == 2e-3 and openai.epochs == 3
    assert Hyperparameters.from_dict({"learning_rate_multiplier": "auto"}) == Hyperparameters()


def test_ids_sort_in_the_order_they_were_made() -> None:
    ids = [new_id("ftjob") for _ in range(50)]
    assert len(set(ids)) == 50 and all(i.startswith("ftjob-") and len(i) == 29 for i in ids)
    stamps = [i[:17] for i in ids]  # the millisecond part; within one, the order is random
    assert stamps == sorted(stamps)


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"rank": 0}, "hyperparameters.rank", "between 1 and"),
        ({"rank": 65}, "hyperparameters.rank", "between 1 and 64"),
        ({"rank": 2.5}, "hyperparameters.rank", "an integer"),
        ({"epochs": True}, "hyperparameters.epochs", "an integer"),
        ({"learning_rate": 1.0}, "hyperparameters.learning_rate", "between"),
        ({"learning_rate": float("nan")}, "hyperparameters.learning_rate", "a number"),
        ({"batch_size": 1}, "hyperparameters.batch_size", "between 2"),
        ({"dropout": 0.1}, "hyperparameters.dropout", "unknown hyperparameter"),
        ([1], "hyperparameters", "an object"),
    ],
)
def test_out_of_range_names_the_field(raw: object, field: str, words: str) -> None:
    with pytest.raises(InvalidInput, match=words) as err:
        Hyperparameters.from_dict(raw)
    assert err.value.field == field


def test_the_rank_limit_comes_from_the_server() -> None:
    with pytest.raises(InvalidInput, match="between 1 and 8"):
        Hyperparameters.from_dict({"rank": 16}, max_rank=8)


def test_records_round_trip() -> None:
    job = Job(new_id("ftjob"), "acme", "m", "file-1", "legal", validation_file="file-2",
              status=JobStatus.SUCCEEDED, result={"registered": True}, seed=3)  # fmt: skip
    d = job.to_dict()
    assert d["object"] == "fine_tuning.job" and d["registered"] is True
    assert Job.from_dict(d) == job
    info = FileInfo("file-1", "acme", "a.jsonl", 10, 3, 1, duplicates=1, warnings=("w",))
    assert FileInfo.from_dict(info.to_dict()) == info
    e = JobEvent(4, 12.0, "step 1/2", type="metrics", data={"step": 1})
    assert e.to_dict(job.id)["id"].endswith("-4")
    assert JobEvent.from_dict(e.to_dict(job.id)) == e
    assert JobStatus.CANCELLED.finished and not JobStatus.RUNNING.finished


def test_suffix_is_an_adapter_name() -> None:
    assert check_suffix("legal-v1.2") == "legal-v1.2"
    for bad in ("", "-x", "a/b", 3, "x" * 129):
        with pytest.raises(InvalidInput) as err:
            check_suffix(bad)
        assert err.value.field == "suffix"
