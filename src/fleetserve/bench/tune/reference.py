"""Checked against the reference library before a model is served (issue 25, item 3).

``fleetserve add`` infers a spec from a model's own files; before it writes the spec,
:func:`check_reference` runs a fixed calibration set (:func:`.reference_set.requests`)
two ways and compares the replies with the tuner's gates (``quality.compare``: rows at
cosine >= 0.9999, scores within 1 % with identical rankings, identical labels, spans
and greedy text):

- through fleetserve, for the spec, on the real path: a worker over the family's
  runner, fp32 torch, as served (:class:`.harness.Stack`), JSON in and out;
- through the library the model was made for (:mod:`.reference_libs`):
  sentence-transformers for its models, transformers' model classes and pipelines
  otherwise, colbert-ai for stanford-nlp ColBERT checkpoints (:mod:`.reference_colbert`,
  in a process of its own).

The result carries the figures per kind of request, the library and its version, and
on a mismatch one line naming the item (which input, which field) and the difference.
A mismatch, a load that fails, or a library that is not installed is a result the
caller acts on (``add`` stops and writes nothing), never an exception.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...catalog import ModelSpec, Profile
from ...catalog.hardware import detect
from ...catalog.infer_family import shape_of
from ...catalog.model_files import CheckpointError, read_model_files
from ...families import AnyFamily, create_family
from ...gateway import envelope as env_mod
from ...runtimes import create_runtime
from ...settings import Settings
from ...wire import Encoding, FleetError, error_from_body
from .harness import Stack
from .reference_colbert import ColbertAi, library_dir
from .reference_compare import Check, checks
from .reference_extract import extract_library
from .reference_libs import Library, NoReference, text_library
from .reference_set import Request, requests

PASSED, FAILED, UNCHECKED = "passed", "failed", "unchecked"


@dataclass(frozen=True)
class ReferenceCheck:
    """The verdict on one spec: ``status`` is ``passed``, ``failed`` (a mismatch, or a
    side that could not load: ``reason`` says which, in one line) or ``unchecked``
    (no reference library for this family here: ``reason`` says what to install)."""

    model: str
    family: str
    library: str
    library_version: str
    calibration_size: int  # inputs (texts, pairs, images, prompts) in the set
    status: str
    reason: str = ""
    checks: tuple[Check, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, for the report ``add`` writes."""
        return {
            "model": self.model,
            "family": self.family,
            "library": self.library,
            "library_version": self.library_version,
            "calibration_size": self.calibration_size,
            "status": self.status,
            "reason": self.reason,
            "checks": [c.to_dict() for c in self.checks],
        }

    def to_markdown(self) -> str:
        """A section for the report: the verdict, then one table row per check."""
        head = f"Reference check of {self.model} ({self.family}) against {self.library}"
        lines = [f"{head} {self.library_version}: **{self.status}**"]
        if self.reason:
            lines += ["", self.reason]
        if self.checks:
            lines += [
                "",
                "| check | requests | items | min cosine | max score diff | ranking | "
                "labels | tokens | verdict |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for c in self.checks:
                cells = [c.name, str(c.requests), str(c.items), _num(c.min_cosine),
                         _num(c.max_score_diff), _same(c.ranking_equal), _same(c.labels_equal),
                         _same(c.tokens_equal), "passed" if c.passed else "failed"]  # fmt: skip
                lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.7f}"


def _same(v: bool | None) -> str:
    return "-" if v is None else ("identical" if v else "differ")


def check_reference(spec: ModelSpec, weights: Path, settings: Settings) -> ReferenceCheck:
    """Compare fleetserve's replies for ``spec`` (the model at ``weights``, a local
    directory) with the reference library's on the calibration set. Runs its own event
    loop: from async code, await :func:`check_reference_async` instead."""
    return asyncio.run(check_reference_async(spec, weights, settings))


async def check_reference_async(
    spec: ModelSpec, weights: Path, settings: Settings
) -> ReferenceCheck:
    """:func:`check_reference` within a running loop (the library runs on a thread)."""
    reqs = requests(spec)
    size = sum(r.items for r in reqs)

    def verdict(library: str, version: str, status: str, reason: str) -> ReferenceCheck:
        return ReferenceCheck(spec.id, spec.family, library, version, size, status, reason)

    try:
        device = detect(settings.device).kind if settings.device == "auto" else settings.device
        lib = library_for(spec, weights, device, settings.reference_dir)
    except NoReference as exc:
        return verdict(exc.library, "", UNCHECKED, str(exc))
    except CheckpointError as exc:  # a file that says what the model is cannot be read
        return verdict("", "", FAILED, f"the model's files: {exc}")
    name, ver = lib.name, lib.version
    loop = asyncio.get_running_loop()
    try:
        ref = await loop.run_in_executor(None, _library_replies, lib, reqs)
    except Exception as exc:  # the library refuses the directory: the spec cannot be checked
        return verdict(name, ver, FAILED, f"{name} failed: {_line(exc)}")
    del lib  # its model: not held while fleetserve loads its own
    try:
        got = await _served(spec, weights, settings, reqs)
    except Exception as exc:  # fleetserve could not load or serve it
        return verdict(name, ver, FAILED, f"fleetserve failed: {_line(exc)}")
    found = checks(reqs, ref, got)
    failed = next((c for c in found if not c.passed), None)
    status, reason = (FAILED, failed.mismatch) if failed else (PASSED, "")
    return ReferenceCheck(spec.id, spec.family, name, ver, size, status, reason, tuple(found))


def library_for(spec: ModelSpec, weights: Path, device: str, reference_dir: str) -> Library:
    """The library ``spec``'s family is checked against; a :class:`NoReference` where
    there is none here (its package is not installed). ``reference_dir``: where the
    libraries that need an environment of their own are (``--reference-dir``). A
    multivector checkpoint's layout is the one ``add`` infers (``infer_family.shape_of``);
    a file that describes it and cannot be read is a :class:`CheckpointError`."""
    if spec.family == "multivector" and not (weights / "modules.json").is_file():
        if shape_of(read_model_files(weights)).kind != "colbert":  # as `add` found it
            raise NoReference(
                "",
                "a multivector model that is neither a PyLate nor a stanford-nlp ColBERT "
                "checkpoint has no reference library: unchecked",
            )
        return ColbertAi(weights, library_dir(reference_dir))
    return text_library(spec, weights, device) or extract_library(spec, weights, device)


def _adapter(spec: ModelSpec, weights: Path, settings: Settings) -> AnyFamily:
    """The spec's family over fp32 torch on the settings' device, unloaded."""
    runtime = create_runtime(
        "torch",
        device=settings.device,
        precision="fp32",
        threads=settings.torch_threads,
        cache_dir=Path(settings.cache_dir).expanduser(),
        options=spec.runtime_options,
    )
    return create_family(spec, runtime, weights)


def _library_replies(lib: Library, reqs: Sequence[Request]) -> list[dict[str, object]]:
    lib.load()
    return [lib.reply(r.task, r.body) for r in reqs]


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


async def _served(
    spec: ModelSpec, weights: Path, settings: Settings, reqs: Sequence[Request]
) -> list[dict[str, object] | FleetError]:
    """Each request through a worker over the spec's runner (fp32 torch), as served;
    a request fleetserve refuses is its error, compared as a mismatch."""
    adapter = _adapter(spec, weights, settings)
    tokens = max(2048, 8 * spec.max_seq_len)  # a whole request per batch
    profile = Profile(hardware="reference", precision="fp32", runtime="torch",
                      max_batch_tokens=tokens)  # fmt: skip
    out: list[dict[str, object] | FleetError] = []
    async with Stack(spec, profile, adapter) as stack:
        for r in reqs:
            raw = json.dumps(r.body).encode()
            env = env_mod.build(
                model=spec.id, task=r.task, content_type=Encoding.JSON, accept=Encoding.JSON,
                body_size=len(raw), timeout=600.0, request_id=None, tenant=None,
            )  # fmt: skip
            pending = await stack.queue.publish(env, raw)
            reply = await pending.wait(600.0)
            if reply.error is not None:
                out.append(error_from_body(reply.error))
            else:
                out.append(json.loads(reply.body))
    return out


__all__ = [
    "FAILED",
    "PASSED",
    "UNCHECKED",
    "Check",
    "ReferenceCheck",
    "check_reference",
    "check_reference_async",
]
