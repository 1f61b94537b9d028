"""The calibration set of the reference check: the tuner's, and what a spec can get
wrong that the tuner's never exercises.

The tuner compares one fleetserve configuration with another, so its set
(``quality.calibration``) needs only the family's main request. Against the
library, the spec itself is on trial, so the set adds:

- for ``dense``: score requests, where the spec's ``query_prefix`` and
  ``document_prefix`` apply (encode clients add their own prefixes, so a missing prompt
  shows only there), and one text longer than any model's limit (a ``max_seq_len``
  above the model's own truncates differently: the issue's cosine of 0.977);
- for ``sparse``: encode requests beside its score requests, and the long text;
- for ``multivector``: score requests and queries (their marker, length, expansion);
- for ``zero_shot``: a multi-label request (scored per label, not across labels);
- for ``image``: texts as well as images (both towers);
- for ``span_ner``: nested, multi-label decoding (no text past the token limit:
  gliner keeps scoring words whose tokens it cut, fleetserve drops them, by design).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...catalog import ModelSpec
from ...runtimes.calibration import CALIBRATION
from ...wire import Task
from .quality import ENTITY_LABELS, LABELS, calibration

LONG_WORDS = 1200  # words in the long text: over 1024 tokens in any tokenizer


@dataclass(frozen=True)
class Request:
    """One calibration request: its kind (``encode``, ``score``, ``extract``,
    ``generate``: the check it counts in), task, JSON body and inputs."""

    name: str
    task: Task
    body: dict[str, object]
    items: int
    family: str


def requests(spec: ModelSpec) -> list[Request]:
    """The reference check's requests for ``spec``'s family, the tuner's set first."""
    base = [(task, body) for task, body in calibration(spec)]
    texts = list(CALIBRATION)
    fam = spec.family
    if fam in ("dense", "multivector"):
        base += [(Task.SCORE, {"query": texts[q], "items": texts[q + 1 : q + 9]}) for q in range(4)]
    if fam == "multivector":  # queries have their own marker, length and expansion
        base += [(Task.ENCODE, {"inputs": texts[k : k + 8], "is_query": True}) for k in (0, 8)]
    if fam == "sparse":
        base += [(Task.ENCODE, {"inputs": texts[k : k + 8]}) for k in range(0, len(texts), 8)]
    if fam in ("dense", "sparse"):
        base.append((Task.ENCODE, {"inputs": [long_text(), texts[0]]}))
    if fam == "zero_shot":  # multi-label scores are another softmax (entailment/contradiction)
        base.append((Task.EXTRACT, {"inputs": texts[:8], "labels": LABELS, "multi_label": True}))
    if fam == "image":
        base.append((Task.ENCODE, {"inputs": texts[:8]}))
    if fam == "span_ner":
        nested = {"flat_ner": False, "multi_label": True}
        base.append((Task.EXTRACT, {"inputs": texts[:8], "labels": ENTITY_LABELS, **nested}))
    return [Request(_name(task), task, body, _items(body), fam) for task, body in base]


def long_text(words: int = LONG_WORDS) -> str:
    """The calibration texts repeated to ``words`` words: longer than any limit."""
    pool = " ".join(CALIBRATION).split()
    return " ".join(pool[i % len(pool)] for i in range(words))


def _name(task: Task) -> str:
    return {Task.ENCODE: "encode", Task.SCORE: "score", Task.EXTRACT: "extract"}.get(
        task, "generate"
    )


def _items(body: dict[str, object]) -> int:
    for key in ("inputs", "items"):
        values = body.get(key)
        if isinstance(values, list):
            return len(values)
    return 1


__all__ = ["LONG_WORDS", "Request", "long_text", "requests"]
