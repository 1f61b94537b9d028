"""sentence-transformers' describing files around a tiny checkpoint, written by hand.

``modules.json``, the Pooling module's ``1_Pooling/config.json``, ``2_Normalize``,
``sentence_bert_config.json`` and ``config_sentence_transformers.json``, in the layout
sentence-transformers saves (legacy ``pooling_mode_*`` keys, as most hub models have).
"""

from __future__ import annotations

import json
from pathlib import Path

from .tinymodels import build_bert


def write_st_files(
    path: Path,
    *,
    pooling: str = "mean",
    normalize: bool = True,
    max_seq_length: int | None = None,
    prompts: dict[str, str] | None = None,
    dim: int = 32,
) -> Path:
    """Make ``path`` (a transformers checkpoint) a sentence-transformers model."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    keys = {
        "cls": "pooling_mode_cls_token",
        "mean": "pooling_mode_mean_tokens",
        "max": "pooling_mode_max_tokens",
        "lasttoken": "pooling_mode_lasttoken",
    }
    pool: dict[str, object] = {"word_embedding_dimension": dim}
    pool |= {key: mode == pooling for mode, key in keys.items()}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    st: dict[str, object] = {"do_lower_case": False}
    if max_seq_length is not None:
        st["max_seq_length"] = max_seq_length
    (path / "sentence_bert_config.json").write_text(json.dumps(st))
    meta = {"prompts": prompts or {}, "similarity_fn_name": "cosine"}
    (path / "config_sentence_transformers.json").write_text(json.dumps(meta))
    return path


def build_st(
    path: Path,
    *,
    max_positions: int = 512,
    pooling: str = "mean",
    normalize: bool = True,
    max_seq_length: int | None = None,
    prompts: dict[str, str] | None = None,
) -> Path:
    """A tiny BERT saved as a sentence-transformers model (see :func:`write_st_files`)."""
    build_bert(path, max_positions=max_positions)
    return write_st_files(
        path,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_seq_length,
        prompts=prompts,
    )
