"""A training run's checkpoints: the LoRA weights only (kilobytes to a few MB) as
safetensors, with the epoch and the fingerprint of the spec they belong to
(``trainer.spec_fingerprint``), so that a job redelivered to another worker resumes
from its last finished epoch and a checkpoint of another job is refused before any
tensor is read."""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # optional: annotations only
    import torch
    from peft import PeftModel

CHECKPOINT_FORMAT = "fleetserve.lora-checkpoint/1"


class CheckpointMismatch(ValueError):
    """A resume checkpoint that is not one, or is for another spec (base, pairs,
    pooling, hyperparameters or seed): start afresh instead."""


def write_checkpoint(state: dict[str, torch.Tensor], epoch: int, fingerprint: str) -> bytes:
    """safetensors bytes of a LoRA state dict, with the epoch and fingerprint."""
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    meta = {"format": CHECKPOINT_FORMAT, "epoch": str(epoch), "fingerprint": fingerprint}
    return save(tensors, metadata=meta)


def read_checkpoint(blob: bytes, fingerprint: str) -> tuple[int, dict[str, torch.Tensor]]:
    """The epoch and state dict of a checkpoint of the spec with ``fingerprint``;
    :class:`CheckpointMismatch` for anything else. The metadata is checked before
    any tensor is read."""
    try:
        (size,) = struct.unpack("<Q", blob[:8])
        meta = json.loads(blob[8 : 8 + size]).get("__metadata__") or {}
        epoch = int(meta.get("epoch", ""))
    except (struct.error, ValueError, AttributeError):
        raise CheckpointMismatch("the resume blob is not a training checkpoint") from None
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointMismatch(f"the resume blob is not a {CHECKPOINT_FORMAT} checkpoint")
    if meta.get("fingerprint") != fingerprint:
        raise CheckpointMismatch(
            "the checkpoint is for another training spec (base model, pairs or settings)"
        )
    from safetensors.torch import load

    return epoch, load(blob)


def load_lora(lora: PeftModel, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(lora, state)
    unexpected = list(getattr(result, "unexpected_keys", ()))
    if unexpected:
        raise CheckpointMismatch(f"checkpoint tensors the model lacks: {unexpected[:3]}")
