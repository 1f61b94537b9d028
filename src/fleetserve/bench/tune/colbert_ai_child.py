"""colbert-ai's encodings, in a process of its own (run by :mod:`.reference_colbert`).

colbert-ai (stanford-futuredata's ColBERT, the library HF/stanford-nlp checkpoints are
made for) needs transformers 4: its ``HF_ColBERT`` skips what transformers 5 requires
of a model class. So it is installed in a folder of its own with the transformers it
needs (``--reference-dir``), and this script runs on fleetserve's interpreter with
that folder first on its path; everything else (torch, numpy, tokenizers' friends)
is the interpreter's. It imports nothing of fleetserve's.

    python -P colbert_ai_child.py LIBRARY_DIR MODEL_DIR

Then one JSON object a line each way. First it writes ``{"ready": {...versions}}``
once the checkpoint is loaded (or ``{"error": ...}`` and exits); then for each
``{"texts": [...], "query": bool}`` it reads, it writes ``{"vectors": [...]}``: a
query's token vectors as ``Checkpoint.queryFromText`` gives them (its ``[MASK]``
expansion included), a document's as ``docFromText(keep_dims=False)`` gives them
(padding and masked punctuation left out). It exits when its input closes.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main(argv: list[str]) -> int:
    library, model = argv
    # the replies' channel is a copy of fd 1; fd 1 itself goes to stderr, for what the
    # library (and C code, and the processes it starts) print
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, library)
    try:
        ck = _load(model)
        from importlib.metadata import version

        import transformers

        ready = {"colbert-ai": version("colbert-ai"), "transformers": transformers.__version__}
    except Exception as exc:
        _send(out, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send(out, {"ready": ready})
    for line in sys.stdin:
        try:
            req = json.loads(line)
            _send(out, {"vectors": _encode(ck, list(req["texts"]), bool(req["query"]))})
        except Exception as exc:
            _send(out, {"error": f"{type(exc).__name__}: {exc}"})
    return 0


def _load(model: str) -> Any:
    import torch

    # fp32 on the CPU: on a GPU colbert-ai would give documents in fp16 (this process
    # runs nothing else)
    torch.cuda.is_available = lambda: False
    torch.cuda.device_count = lambda: 0
    from colbert.infra import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint
    from colbert.modeling.colbert import ColBERT

    # its C++ MaxSim (compiled on first use) serves search over an index; encoding
    # never calls it
    ColBERT.loaded_extensions = True
    return Checkpoint(model, colbert_config=ColBERTConfig(), verbose=0)


def _encode(ck: Any, texts: list[str], query: bool) -> list[list[list[float]]]:
    import torch

    with torch.inference_mode():
        if query:
            return [q.tolist() for q in ck.queryFromText(texts)]
        return [d.tolist() for d in ck.docFromText(texts, keep_dims=False)]


def _send(out: Any, obj: dict[str, object]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
