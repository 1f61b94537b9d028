"""``multivector`` in the HF/stanford-nlp layout, checked against colbert-ai.

colbert-ai (stanford-futuredata's ColBERT) is the library those checkpoints are made
for, and it needs transformers 4 (fleetserve runs 5). ``make serve`` installs it with
the transformers it needs into a folder of its own, ``<reference dir>/colbert-ai``
(``--reference-dir``; ``pip install --target``, no dependencies: the rest is ours), and
:mod:`.colbert_ai_child` encodes there, on this interpreter, in a process of its own.

Queries are its ``queryFromText`` (``[MASK]`` expansion included), documents its
``docFromText`` (padding and masked punctuation left out), both L2-normalized as the
library gives them, in fp32 on the CPU; a score is MaxSim over those, as colbert-ai
scores.

A vocabulary without some ASCII punctuation character makes colbert-ai mask every
``[UNK]`` in documents (its skiplist takes each character's first token), where
fleetserve (and sentence-transformers' PyLate reader) skip only the characters the
vocabulary has; real BERT vocabularies have them all, and so do the tests' tiny ones.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import tempfile
import weakref
from importlib.metadata import distributions
from pathlib import Path
from typing import IO, Any

import numpy as np

from ...wire import Task
from .reference_libs import NoReference

PACKAGE = "colbert-ai"
# what `make serve` installs there (Makefile: REFERENCE_COLBERT, tests/test_makefile.py)
INSTALL = (
    "colbert-ai==0.2.22 transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.2 "
    "ujson==6.1.0 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3"
)
CHILD = Path(__file__).with_name("colbert_ai_child.py")
REPLY_S = 600.0  # the most a load or one request may take before the child is killed


def library_dir(reference_dir: str) -> Path:
    """Where colbert-ai is installed: ``<reference_dir>/colbert-ai``, or beside this
    interpreter where the setting is empty."""
    root = Path(reference_dir).expanduser() if reference_dir else Path(sys.prefix) / "reference"
    return root / PACKAGE


class ColbertAi:
    """colbert-ai over a stanford-nlp ColBERT directory, in a child process started by
    :meth:`load` and stopped when this object goes (or its input closes)."""

    name = PACKAGE

    def __init__(self, path: Path, library: Path) -> None:
        found = {
            str(d.metadata["Name"] or "").lower(): d.version
            for d in distributions(path=[str(library)])
        }
        if PACKAGE not in found:
            raise NoReference(
                PACKAGE,
                f"a ColBERT checkpoint in the HF/stanford-nlp layout is checked against "
                f"colbert-ai, which is not installed in {library} (`make serve` installs it: "
                f"pip install --no-deps --target {library} {INSTALL}): multivector is unchecked",
            )
        self.path, self.library = path, library
        self.version = f"{found[PACKAGE]} (transformers {found.get('transformers', '?')})"
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    def load(self) -> None:
        log = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115  # closed with the child
        proc = subprocess.Popen(
            [sys.executable, "-P", str(CHILD), str(self.library), str(self.path.resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self._proc, self._log = proc, log
        weakref.finalize(self, _stop, proc, log)
        self._read("ready")

    def _read(self, key: str) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        out = self._proc.stdout
        if not select.select([out], [], [], REPLY_S)[0]:
            self._proc.kill()
            raise RuntimeError(f"colbert-ai gave no reply in {REPLY_S:.0f} s: {self._last_words()}")
        line = out.readline()
        if not line:
            raise RuntimeError(f"colbert-ai's process exited: {self._last_words()}")
        try:
            reply = json.loads(line)
        except ValueError:
            raise RuntimeError(f"colbert-ai wrote what is not a reply: {line[:200]!r}") from None
        if "error" in reply:
            raise RuntimeError(f"colbert-ai: {reply['error']}")
        return reply[key]

    def _last_words(self) -> str:
        """The child's exit and the last line it wrote on stderr."""
        assert self._proc is not None and self._log is not None
        code = self._proc.wait()
        self._log.seek(0)
        lines = [ln.strip() for ln in self._log.read().splitlines() if ln.strip()]
        return f"exit {code}: " + (lines[-1] if lines else "(nothing on stderr)")

    def _encode(self, texts: list[str], query: bool) -> list[np.ndarray[Any, Any]]:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps({"texts": texts, "query": query}) + "\n")
            self._proc.stdin.flush()
        except OSError:  # it died
            raise RuntimeError(f"colbert-ai's process exited: {self._last_words()}") from None
        return [np.asarray(m, np.float64) for m in self._read("vectors")]

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        if task is Task.SCORE:
            (q,) = self._encode([body["query"]], True)
            docs = self._encode(list(body["items"]), False)
            return {"scores": [float((q @ d.T).max(axis=1).sum()) for d in docs]}
        mats = self._encode(list(body["inputs"]), bool(body.get("is_query", False)))
        return {"embeddings": [m.tolist() for m in mats]}


def _stop(proc: subprocess.Popen[str], log: IO[str]) -> None:
    if proc.stdin is not None:
        with contextlib.suppress(OSError):  # (a child already gone)
            proc.stdin.close()  # the child's loop ends
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    log.close()


__all__ = ["INSTALL", "PACKAGE", "ColbertAi", "library_dir"]
