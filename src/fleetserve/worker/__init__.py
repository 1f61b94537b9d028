"""The worker: pull loop, batch former and cost model, model runners."""

from .batcher import BatchFormer, Job, WorkItem
from .loop import Worker
from .runner import ModelRunner

__all__ = ["BatchFormer", "Job", "ModelRunner", "WorkItem", "Worker"]
