"""A spec file written from what :func:`.infer.infer` found, with its evidence.

``fleetserve add`` writes the spec it inferred to the user's catalog directory. Each
inferred key is on its own line with a comment naming the file and key it came from,
so that a reader sees why without running anything; the labels and the notes follow
as comments. What :func:`render_spec` returns parses with ``ModelSpec.from_dict`` to
the inferred fields (a test checks).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .infer import Inferred


def render_spec(
    model_id: str,
    sources: Sequence[str],
    found: Inferred,
    *,
    description: str = "",
    header: str = "written by `fleetserve add` from the model's own files",
) -> str:
    """The YAML text of a spec for ``model_id`` at ``sources`` with ``found``'s fields."""
    ev = found.evidence
    lines = [f"# {_one_line(model_id)}: {_one_line(header)}.", f"id: {_scalar(model_id)}"]
    if description:
        lines.append(f"description: {_scalar(description)}")
    fields = found.spec_fields()
    lines.append(_line("family", fields.pop("family"), ev.get("family")))
    lines.append(_line("runtime", fields.pop("runtime"), None))
    lines.append("sources:")
    lines += [f"  - {_scalar(s)}" for s in sources]
    options = fields.pop("options", {})
    for key, value in fields.items():
        lines.append(_line(key, value, ev.get(key)))
    if isinstance(options, dict) and options:
        lines.append("options:")
        for key, value in options.items():
            lines.append("  " + _line(str(key), value, ev.get(f"options.{key}")))
    if found.labels:
        where = ev.get("labels", "config.json: id2label")
        lines.append(f"# labels ({_one_line(where)}): {_one_line(', '.join(found.labels))}")
    lines += [f"# note: {_one_line(n)}" for n in found.notes]
    return "\n".join(lines) + "\n"


def _line(key: str, value: object, why: str | None) -> str:
    text = f"{key}: {_scalar(value)}"
    return f"{text}  # {_one_line(why)}" if why else text


def _scalar(value: object) -> str:
    """A YAML flow value: JSON is YAML, and JSON strings are YAML's double-quoted ones."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


__all__ = ["render_spec"]
