"""GGUF to safetensors, once: a cached model directory that transformers loads fast.

transformers reads GGUF itself (``from_pretrained(dir, gguf_file=...)``, which
dequantizes to fp32 and rebuilds the tokenizer and chat template), but slowly: about
40 s for SmolLM2-135M on two cores. So a GGUF source is converted once into
``<cache_dir>/gguf/<name>-<digest>/`` (config, fp32 safetensors, tokenizer, chat
template, generation config). The directory is written under a temporary name and
renamed into place, so a crash never leaves half a cache, and built once per host
(:mod:`.entries`); later loads take seconds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .entries import build_entry
from .rules import install_hint

MARKER = "fleetserve-gguf.json"  # written last: its presence means the directory is whole
_PROBE = 1 << 20

log = logging.getLogger("fleetserve.catalog")


def converted_path(gguf: Path, cache_dir: Path) -> Path:
    """Where ``gguf`` is converted to (whether or not it is there yet).

    The digest covers the file's size, first and last MiB, so a changed file converts
    again and the same file installed elsewhere reuses the conversion."""
    st = gguf.stat()
    return cache_dir / "gguf" / f"{gguf.stem}-{_digest(gguf, st.st_size, st.st_mtime_ns)}"


@functools.lru_cache(maxsize=64)
def _digest(gguf: Path, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256(str(size).encode())
    with gguf.open("rb") as f:
        h.update(f.read(_PROBE))
        f.seek(max(size - _PROBE, 0))
        h.update(f.read(_PROBE))
    return h.hexdigest()[:16]


def is_converted(dest: Path) -> bool:
    return (dest / MARKER).is_file()


def convert_gguf(gguf: Path, cache_dir: Path, *, console: Console | None = None) -> Path:
    """The converted directory for ``gguf``, converting it the first time (once per
    host: another process converting it at the same time is waited for)."""
    if not gguf.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf}")
    return build_entry(
        converted_path(gguf, cache_dir),
        is_converted,
        lambda tmp: _convert(gguf, tmp, console or Console(stderr=True)),
    )


def _convert(gguf: Path, out: Path, console: Console) -> None:
    """Convert in a child process: the GGUF reader is pure Python, and in this process
    it would hold the GIL for seconds at a time while other models serve. The child
    draws no bars; its output is kept, and a failure is a RuntimeError with its last
    line. One log line says what the conversion took."""
    cmd = [sys.executable, "-c", _CHILD, str(gguf), str(out)]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else f"exit status {done.returncode}"
        raise RuntimeError(f"converting {gguf.name} failed: {last}"[:400])
    if not (out / MARKER).is_file():
        raise RuntimeError(f"converting {gguf.name} wrote no {MARKER}")
    seconds = json.loads((out / MARKER).read_text()).get("seconds")
    log.info(
        "converted %s to safetensors in %s s (once: kept under %s)", gguf.name, seconds, out.parent
    )


# the child's program: not ``-m`` this module, which the package has imported already
_CHILD = "import sys; from fleetserve.catalog.gguf import child; child(sys.argv[1:])"


def _convert_here(gguf: Path, out: Path, console: Console) -> None:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "converting GGUF needs transformers, gguf and accelerate: "
            + install_hint("torch,generate")
        ) from exc
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    t0 = time.perf_counter()
    with _steps(console, f"converting {gguf.name} to safetensors (once)") as step:
        step("reading the tokenizer and chat template")
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        step("dequantizing the weights")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name
        )
        _drop_quantizer(model)
        step("writing safetensors")
        model.save_pretrained(str(out))
        tok.save_pretrained(str(out))
        step("done")
    info = {
        "source": str(gguf),
        "size": gguf.stat().st_size,
        "seconds": round(time.perf_counter() - t0, 1),
        "transformers": transformers.__version__,
    }
    (out / MARKER).write_text(json.dumps(info, indent=2) + "\n")


def _drop_quantizer(model: Any) -> None:
    """The loaded weights are already dequantized: save them as a plain checkpoint."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


@contextmanager
def _steps(console: Console, title: str) -> Iterator[Any]:
    """A progress bar over the conversion's steps (one line on a terminal)."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    total = 3
    with progress:
        task = progress.add_task(title, total=total)
        count = 0

        def step(name: str) -> None:
            nonlocal count
            if count:
                progress.advance(task)
            count += 1
            progress.update(task, description=f"{title}: {name}")

        yield step


def child(argv: list[str]) -> None:
    """The child of ``_convert``: GGUF OUT."""
    _one_name_map_per_shape()
    _convert_here(Path(argv[0]), Path(argv[1]), Console(stderr=True, quiet=True))


def _one_name_map_per_shape() -> None:
    """transformers maps the GGUF's tensor names once per submodule of the model, and
    builds gguf's name map anew each time (some 300 times for SmolLM2-135M: 5 of the
    conversion's 21 CPU-seconds on a 2-core AMD EPYC). The map is read only once built,
    so this child builds it once per architecture and depth."""
    try:
        import gguf
    except ImportError:  # _convert_here says which extra to install
        return
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
