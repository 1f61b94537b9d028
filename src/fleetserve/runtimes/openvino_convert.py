"""Convert a checkpoint to OpenVINO IR once, and cache it.

One IR per (checkpoint, head) carries every output of that head (``head_graph.OUTPUTS``)
with pooling and SPLADE baked in, as the ONNX export does. It is made by OpenVINO's
PyTorch frontend straight from the wrapped torch module (``ov.convert_model`` with an
example input), then compiled in f32 and checked against torch on a batch of another
shape. A cache entry is ``cache_dir/openvino/<key>/`` holding ``model.xml``, ``model.bin``
(fp32 weights: bf16 and fp16 are chosen when compiling) and ``meta.json``. torch is
imported only to convert.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from importlib import metadata
from pathlib import Path

from rich.console import Console

from ..catalog.entries import build_entry
from .base import Head
from .cache import weights_fingerprint
from .head_graph import OUTPUTS, TRACING, head_graph

try:
    import openvino as ov
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the OpenVINO runtime needs openvino: pip install 'fleetserve[openvino]'"
    ) from exc

log = logging.getLogger("fleetserve.runtimes.openvino")

FORMAT = 1  # bump when the converted graph changes shape or meaning
FILES = ("model.xml", "model.bin", "meta.json")


def openvino_version() -> str:
    """The full build string, e.g. ``2026.4.1-22982-e213a147257-releases/2026/4``."""
    return str(ov.get_version())


def cache_key(path: Path, head: Head) -> str:
    """Hash of the format version, the OpenVINO version, the head, config.json and the
    weight files' names, sizes and mtimes. OpenVINO is keyed (an IR is read by the
    version that serves it, and a new converter may convert better); torch is not, so
    that an entry made where torch is installed still matches where it is not."""
    h = hashlib.sha256(f"format={FORMAT};openvino={openvino_version()};head={head}".encode())
    h.update(weights_fingerprint(path))
    return h.hexdigest()[:24]


def is_complete(entry: Path) -> bool:
    """All three files there, and the weights as large as when they were written."""
    if not all((entry / f).is_file() for f in FILES):
        return False
    try:
        meta = json.loads((entry / "meta.json").read_text())
        return int(meta["bin_bytes"]) == (entry / "model.bin").stat().st_size
    except (OSError, ValueError, KeyError, TypeError):
        return False


def ensure_ir(path: Path, head: Head, cache_dir: Path, console: Console | None = None) -> Path:
    """The cache entry for ``path`` with ``head``, converting it first if there is none
    (or only an incomplete one). Built in a temporary directory and renamed into place,
    so that no partial entry is ever visible."""
    head = Head(head)
    entry = Path(cache_dir) / "openvino" / cache_key(path, head)

    def build(tmp: Path) -> None:
        t0 = time.perf_counter()
        out = console or Console(stderr=True)
        if out.is_terminal:
            with out.status(f"Converting {path} ({head}) to OpenVINO IR…"):
                convert(path, head, tmp / "model.xml")
        else:
            convert(path, head, tmp / "model.xml")
        meta = {
            "source": str(path),
            "head": str(head),
            "outputs": [str(o) for o in OUTPUTS[head]],
            "format": FORMAT,
            "openvino": openvino_version(),
            "bin_bytes": (tmp / "model.bin").stat().st_size,
            "convert_seconds": round(time.perf_counter() - t0, 3),
            "versions": {p: _version(p) for p in ("torch", "transformers")},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        log.info("converted %s (%s) in %.1fs", path, head, meta["convert_seconds"])

    return build_entry(entry, is_complete, build)


def convert(path: Path, head: Head, dest: Path) -> None:
    """Trace ``path``'s head graph with OpenVINO's PyTorch frontend, save it as IR at
    ``dest`` (fp32 weights), and check it against torch in f32."""
    graph = head_graph(path, head, what="OpenVINO IR")  # a clear ImportError without torch
    import torch

    inputs = [(n, ov.PartialShape([-1, -1]), ov.Type.i64) for n in graph.inputs]
    with TRACING, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on shape-dependent Python code
        model = ov.convert_model(
            graph.module, example_input=graph.tensors(graph.example(2, 8)), input=inputs
        )
    for port, name in zip(model.inputs, graph.inputs, strict=True):
        port.get_tensor().set_names({name})
    for port, out in zip(model.outputs, graph.outputs, strict=True):
        port.get_tensor().set_names({str(out)})
    ov.save_model(model, str(dest), compress_to_fp16=False)  # the default would halve them
    check = graph.example(3, 11, seed=1)
    compiled = ov.Core().compile_model(str(dest), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    result = compiled.create_infer_request().infer(check)
    got = [result[compiled.output(str(o))] for o in graph.outputs]
    graph.check(path, got, graph.reference(check), "OpenVINO conversion")


def read_meta(entry: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((entry / "meta.json").read_text())
    return data


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
