"""A gateway's hot remove in distributed mode (``gateway/shared_models.py``): the
DELETE answers once no worker's heartbeat lists the model, or after its drain time."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.gateway.shared_models import SharedAdmin
from fleetserve.wire import ModelNotFound

MODEL = "hot/model"


class Bucket:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def put(self, model: str, fields: Mapping[str, object]) -> None:
        raise AssertionError("not called")

    async def delete(self, model: str) -> None:
        self.deleted.append(model)


def catalog() -> Catalog:
    c = Catalog([])
    c.add(ModelSpec.from_dict({"id": MODEL, "family": "dense", "sources": ["/m"]}))
    return c


async def test_the_delete_waits_until_no_worker_lists_the_model() -> None:
    bucket, looks = Bucket(), []

    def held(model: str) -> list[str]:
        looks.append(model)  # two beats still list it (draining), then none
        return ["w1"] if len(looks) <= 2 else []

    admin = SharedAdmin(bucket, catalog(), list, held=held, drain_s=30.0)
    await admin.remove(MODEL)
    assert bucket.deleted == [MODEL] and len(looks) == 3
    assert MODEL not in admin.catalog


async def test_a_worker_that_drains_past_the_limit_is_logged_and_the_delete_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = SharedAdmin(Bucket(), catalog(), list, held=lambda m: ["w1", "w2"], drain_s=0.2)
    with caplog.at_level(logging.WARNING, "fleetserve.models"):
        await admin.remove(MODEL)
    assert "hot/model: removed; w1, w2 still drain it after 0.2s" in caplog.text


async def test_an_unknown_model_is_a_404_and_nothing_is_deleted() -> None:
    bucket = Bucket()
    with pytest.raises(ModelNotFound):
        await SharedAdmin(bucket, catalog(), list).remove("no/such")
    assert bucket.deleted == []
