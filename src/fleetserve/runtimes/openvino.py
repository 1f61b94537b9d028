"""The OpenVINO runtime: Intel's CPU engine, with AMX and AVX-512 bf16 kernels.

``load`` finds (or makes, see ``openvino_convert``) the cached IR of the checkpoint's
head, which carries every output of that head with pooling and SPLADE baked in, and
compiles it for the CPU with:

- ``INFERENCE_PRECISION_HINT`` f32, bf16 or f16 (always set: OpenVINO's own default on
  a CPU with AMX is bf16). ``precision`` is then read back from the compiled model, so
  it says what runs, logged once where it differs: OpenVINO ignores a hint the CPU has
  no kernels for and keeps its default (bf16 with AVX-512, else fp32), so bf16 asked for
  below AVX-512 runs fp32, and fp16 without AVX512-FP16 (AMD EPYC) runs bf16;
- ``PERFORMANCE_HINT`` LATENCY and ``NUM_STREAMS`` 1: the worker runs one forward at a
  time, from its one compute thread;
- ``INFERENCE_NUM_THREADS`` = ``threads`` (0 keeps OpenVINO's default: all cores).

The compiled model is kept beside the IR, one per precision (OpenVINO's ``CACHE_DIR``:
``<entry>/compiled/<precision>``), so a reload, in this process or the next, imports it
rather than compiling the IR again (``from_cache`` says which it was). OpenVINO keys its
blobs by the IR and the plugin's version, not by the precision hint: a blob imported
with another hint reads back that hint but does not run at it (on a 2-core cpu-amx Xeon,
OpenVINO 2026.4, an fp16 blob imported at bf16 gave fp16's numbers, and an fp32 blob
imported at bf16 gave NaN and crashed a MiniLM's forward); hence a directory per
precision. A blob it cannot read it compiles and writes again. A cache directory that
cannot be used costs one warning, and the model compiles without it.

``run`` feeds the int64 arrays without copying them (``share_inputs``) to one infer
request and copies out only the requested output, as float32: the request's output
buffers are overwritten by the next forward. Call ``run`` from one thread. OpenVINO
releases the GIL during ``infer`` (a test counts a Python thread's progress during
one), so tokenizing and postprocessing go on meanwhile.

Adapters run inside the graph (``adapter_slots`` > 0): ``prepare_adapters`` compiles,
beside the served IR, one with LoRA slots on the targeted Linear layers
(``openvino_lora``, ``graph_slots``); a batch planned with adapter rows runs on it
through its :class:`~fleetserve.runtimes.slot_bank.SlotBank`, and base-only batches stay
on the served IR, at its speed.

int8 is not offered: OpenVINO's int8 needs NNCF (weight compression, or calibrated
quantization behind a quality guard); see docs/openvino.md. CPU only.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console

from ..wire.values import Array
from .base import Head, Output
from .cache import DEFAULT_CACHE
from .engines import OvCompiledModel, OvCore, OvInferRequest
from .graph_slots import GraphSlots

if TYPE_CHECKING:
    from .lora_slots import Layout, SlotEntry
    from .openvino_lora import SlotModel

try:
    import openvino as ov
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the OpenVINO runtime needs openvino: pip install 'fleetserve[openvino]'"
    ) from exc

log = logging.getLogger("fleetserve.runtimes.openvino")

# our precision names -> OpenVINO's element types, and back
PRECISIONS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
_RUNNING = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
COMPILED_SHARE = {"fp32": 1.0, "bf16": 0.5, "fp16": 0.5}  # the compiled copy, of the fp32 file
_warned: set[tuple[str, str]] = set()
_core: OvCore | None = None
COMPILED = "compiled"  # in a cache entry: OpenVINO's compiled-model caches


def compiled_dir(entry: Path, precision: str) -> Path:
    """Where ``entry``'s IR compiled at (the requested) ``precision`` is kept."""
    return entry / COMPILED / precision


def core() -> OvCore:
    """The process's one ``ov.Core``."""
    global _core
    if _core is None:
        _core = ov.Core()
    return _core


class OpenVinoRuntime(GraphSlots):
    name = "openvino"

    def __init__(
        self,
        device: str = "cpu",
        precision: str = "fp32",
        threads: int = 0,
        cache_dir: Path = DEFAULT_CACHE,
        *,
        console: Console | None = None,
        adapter_slots: int = 0,
        max_rank: int = 64,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(
                f"the openvino runtime runs {', '.join(PRECISIONS)}, not {precision!r}"
                + (" (int8 is not offered: see docs/openvino.md)" if precision == "int8" else "")
            )
        if device not in ("cpu", "auto"):
            raise ValueError(
                f"the openvino runtime runs on the CPU only, not on {device!r}: "
                "use runtime torch or external on GPUs"
            )
        self.device = "cpu"
        self.requested_precision = precision
        self.precision = precision  # what runs once loaded, read back from the compiled model
        self.threads = threads
        self.cache_dir = Path(cache_dir)
        self.console = console
        self.head = Head.BASE
        self.entry: Path | None = None  # the cache entry in use
        self._compiled: OvCompiledModel | None = None
        self._request: OvInferRequest | None = None
        self._ports: dict[Output, int] = {}
        self._types = False
        self._bytes = 0
        self.from_cache = False  # the compiled model was imported from the entry's cache
        self._init_slots(adapter_slots, max_rank)  # LoRA in the graph (0 slots: none)

    def config(self) -> dict[str, str]:
        """The compile properties."""
        cfg = {
            "INFERENCE_PRECISION_HINT": PRECISIONS[self.requested_precision],
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": "1",
        }
        if self.threads > 0:
            cfg["INFERENCE_NUM_THREADS"] = str(self.threads)
        return cfg

    def load(self, path: Path, head: Head = Head.BASE) -> None:
        head = Head(head)
        entry, compiled = self._compile(Path(path), head)
        self._compiled, self._request = compiled, compiled.create_infer_request()
        self.entry, self.head = entry, head
        self.precision = running_precision(compiled, self.requested_precision)
        self._ports = {Output(p.get_any_name()): i for i, p in enumerate(compiled.outputs)}
        self._types = "token_type_ids" in {p.get_any_name() for p in compiled.inputs}
        self._bytes = (entry / "model.bin").stat().st_size
        self._loaded_slots(Path(path), head, entry)

    def _compile(self, path: Path, head: Head) -> tuple[Path, OvCompiledModel]:
        """The cached IR, compiled; an entry that does not compile is rebuilt once."""
        from .openvino_convert import ensure_ir

        for attempt in range(2):
            entry = ensure_ir(path, head, self.cache_dir, self.console)
            try:
                return entry, self._compile_entry(entry)
            except RuntimeError as exc:  # OpenVINO raises RuntimeError("Exception from src/…")
                if attempt or not str(exc).startswith("Exception from"):
                    raise
                log.warning("cache entry %s does not load (%s); rebuilding it", entry, exc)
                shutil.rmtree(entry, ignore_errors=True)
        raise AssertionError("unreachable")

    def _compile_entry(self, entry: Path) -> OvCompiledModel:
        """The entry's IR compiled through its compiled-model cache; without the cache
        (one warning) where OpenVINO cannot use it."""
        xml, cache = str(entry / "model.xml"), compiled_dir(entry, self.requested_precision)
        for stale in (entry / COMPILED).glob("*.blob"):  # one for every precision, before
            with contextlib.suppress(OSError):
                stale.unlink(missing_ok=True)
        try:
            compiled = core().compile_model(xml, "CPU", self.config() | {"CACHE_DIR": str(cache)})
        except RuntimeError as exc:
            if not str(exc).startswith("Exception from"):
                raise
            # without the cache: where that fails too, the entry is at fault (the caller's)
            compiled = core().compile_model(xml, "CPU", self.config())
            why = str(exc).strip().splitlines()[-1]
            log.warning(
                "cannot keep the compiled model in %s (%s); compiled without it", cache, why
            )
            self.from_cache = False
            return compiled
        self.from_cache = bool(compiled.get_property("LOADED_FROM_CACHE"))
        if not self.from_cache and not any(cache.glob("*.blob")):  # OpenVINO wrote nothing
            log.warning("could not keep the compiled model in %s; the next load compiles", cache)
        return compiled

    def run(
        self,
        input_ids: Array,
        attention_mask: Array,
        output: Output,
        token_type_ids: Array | None = None,
    ) -> Array:
        request = self._request
        if request is None:
            raise RuntimeError("model is not loaded")
        port = self._ports.get(Output(output))
        if port is None:
            have = ", ".join(self._ports)
            raise ValueError(f"the {self.head} head gives {have}, not {Output(output)}")
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        bank = self.planned_bank()
        if bank is not None:  # a batch with adapter rows: the slots' IR
            named = {"input_ids": ids, "attention_mask": attention_mask}
            if self._types:
                named["token_type_ids"] = (
                    np.zeros_like(ids) if token_type_ids is None else token_type_ids
                )
            return bank.run(named, Output(output))
        feed = [ids, np.ascontiguousarray(attention_mask, dtype=np.int64)]
        if self._types:
            types = np.zeros_like(ids) if token_type_ids is None else token_type_ids
            feed.append(np.ascontiguousarray(types, dtype=np.int64))
        request.infer(feed, share_inputs=True, share_outputs=True)
        return np.array(request.get_output_tensor(port).data, dtype=np.float32)

    # -- adapters in the graph (``GraphSlots``) ------------------------------------------
    def _ensure_slots(
        self, path: Path, head: Head, entry: Path, targets: Sequence[str]
    ) -> SlotEntry:
        from .openvino_lora import ensure_slots

        return ensure_slots(path, head, entry, targets)

    def _compile_slots(self, found: SlotEntry, layout: Layout) -> tuple[SlotModel, int]:
        from .openvino_lora import SlotModel

        # no CACHE_DIR: OpenVINO sets the process's C locale while it reads or writes a
        # compiled blob, and this compile runs beside serving (a fit in the background):
        # other threads decoded text as ASCII meanwhile. Without it, 0.27 s for MiniLM's
        # (0.14 s from a blob)
        model = SlotModel(found.model, layout, found.inputs, found.outputs, self.config(), core())
        size = (found.model.parent / "model.bin").stat().st_size
        return model, size + int(size * COMPILED_SHARE.get(self.precision, 1.0))

    def memory_bytes(self) -> int:
        """What the compiled model holds: its own copy of the weights at the precision it
        runs (bf16 and fp16 half of fp32), and the fp32 weights file it keeps mapped (the
        IR's, or the compiled blob's), whose pages its compile touched. A random BERT with
        a 56 MiB IR grew a process by 56 MiB of each at fp32 (2-core cpu-avx2)."""
        return self._bytes + int(self._bytes * COMPILED_SHARE.get(self.precision, 1.0))


def running_precision(compiled: OvCompiledModel, requested: str) -> str:
    """The precision ``compiled`` runs at, read back from it; a fallback from
    ``requested`` is logged once per process."""
    actual = compiled.get_property("INFERENCE_PRECISION_HINT")
    got = _RUNNING.get(actual.to_string() if hasattr(actual, "to_string") else str(actual), "")
    if not got:
        raise RuntimeError(f"OpenVINO compiled at an unknown precision {actual!r}")
    if got != requested and (requested, got) not in _warned:
        _warned.add((requested, got))
        log.warning(
            "%s was asked for, but this CPU runs it at %s in OpenVINO (no native %s kernels)",
            requested,
            got,
            requested,
        )
    return got
