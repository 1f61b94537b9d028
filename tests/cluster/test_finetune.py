"""Fine-tuning in distributed mode: a job posted to the gateway is a message on its own
JetStream stream; a worker started with --train takes it. When that worker is killed
mid-job, the job is redelivered to the other one after train_ack_wait and resumes from
its last checkpoint; it succeeds, and nothing is lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetserve import Client

from ..conftest import TINY
from ..extras import needs
from ..lora.jobs.test_embedded import pairs_file
from ..tinymodels import build_bert, write_spec
from ..waiting import wait_for
from .conftest import start_cluster

pytestmark = needs("sentence_transformers", extra="train")


def test_a_killed_trainer_leaves_its_job_to_another_which_resumes_it(tmp_path: Path) -> None:
    cat = tmp_path / "catalog"
    write_spec(cat, TINY, build_bert(tmp_path / "bert"), pinned=True)
    rc = start_cluster(
        cat, tmp_path, workers=2, models=TINY, cache_dir=str(tmp_path / "cache"),
        train=True, train_ack_wait=3.0, train_min_pairs=8,
    )  # fmt: skip
    try:
        with Client(rc.api, timeout=60) as c:
            f = c.upload_file(pairs_file(tmp_path / "p.jsonl", n=48))
            # 10 steps an epoch, some 50 a second on an idle 2-core machine: the kill
            # must land before the last epoch, and the job's events are written once a
            # second (a third of the ack wait). With 4 epochs, a clean-clone run saw
            # the job succeed before the kill (it was the run's last test).
            job = c.create_fine_tuning_job(
                TINY, f["id"], suffix="resumed", margin=-1.0,
                hyperparameters={"epochs": 20, "batch_size": 4, "rank": 4},
            )  # fmt: skip

            def events() -> list[dict[str, Any]]:  # all of them (200 steps), oldest first
                out: list[dict[str, Any]] = []
                while page := c.fine_tuning_events(
                    job["id"], after=out[-1]["id"] if out else None, limit=100
                ):
                    out += page
                return list(reversed(out))

            assert wait_for(lambda: any("checkpoint after epoch 1" in e["message"]
                                        for e in events()), timeout=120), events()  # fmt: skip
            started = [e for e in events() if e["message"].startswith("training started")]
            node = started[0]["data"]["node"]
            rc.kill_worker(int(node.rsplit("-", 1)[1]))  # worker-N dies mid-job
            done = c.wait_fine_tuning_job(job["id"], timeout=240)
            assert done["status"] == "succeeded", done
            assert done["attempts"] == 2 and done["result"]["resumed_from_epoch"] >= 1
            assert done["fine_tuned_model"] == f"{TINY}:default/resumed@1"
            again = [e for e in events() if e["message"].startswith("training started")]
            assert len(again) == 2 and "resuming from a checkpoint" in again[1]["message"]
            assert again[1]["data"]["node"] != node
            assert c.encode(done["fine_tuned_model"], ["quick brown fox"]).shape == (1, 32)
    finally:
        rc.cluster.stop()
