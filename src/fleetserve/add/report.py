"""What ``fleetserve add`` found and measured, as markdown and JSON: the family and
why, every inferred field with its evidence, the reference check's figures, the tune
against torch fp32, the memory footprint and the time each stage took."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..wire.json_value import JSON

MIB = 1 << 20


@dataclass
class Tuned:
    """The tune's outcome: the winner against torch fp32 at the default batch."""

    winner: str
    tokens_per_s: float
    torch_fp32_tokens_per_s: float | None
    profile_file: str
    tune_report: str

    @property
    def vs_torch_fp32(self) -> float | None:
        ref = self.torch_fp32_tokens_per_s
        return self.tokens_per_s / ref if ref else None


@dataclass
class AddReport:
    model: str
    source: str
    path: str
    hardware_class: str
    fields: dict[str, JSON]
    evidence: dict[str, str]
    check: dict[str, JSON] = field(default_factory=dict)  # the reference check
    check_markdown: str = ""  # its section of the report
    tuned: Tuned | None = None
    not_tuned: str = ""  # why there is no tune (--no-tune, a failed tune)
    weights_bytes: int = 0  # on disk
    resident_bytes: int | None = None  # weights and activation peak, as the tune measured
    spec_file: str = ""
    seconds: dict[str, float] = field(default_factory=dict)  # per stage

    def to_dict(self) -> dict[str, JSON]:
        d: dict[str, JSON] = json.loads(json.dumps(asdict(self)))
        if self.tuned is not None:
            ratio = self.tuned.vs_torch_fp32
            d["tuned"] = {**asdict(self.tuned), "vs_torch_fp32": ratio}
        return d

    def markdown(self) -> str:
        lines = [
            f"# fleetserve add {self.model}",
            "",
            f"- Source: `{self.source}` ({self.path})",
            f"- Family: **{self.fields.get('family')}** ({self.evidence.get('family', '?')})",
            f"- Spec: `{self.spec_file}`" if self.spec_file else "- Spec: not written",
            f"- Hardware class: {self.hardware_class}",
            f"- Weights on disk: {self.weights_bytes / MIB:,.1f} MiB"
            + (
                f"; resident when served (weights and activation peak, measured by the "
                f"tune): {self.resident_bytes / MIB:,.1f} MiB"
                if self.resident_bytes
                else ""
            ),
            "",
            "## Fields and their evidence",
            "",
            "| field | value | from |",
            "| --- | --- | --- |",
        ]
        for k, v in self.fields.items():
            lines.append(f"| {k} | `{json.dumps(v)}` | {self.evidence.get(k, '')} |")
        lines += ["", "## Reference check", "", self.check_markdown.strip() or "- not run"]
        lines += ["", "## Tuning", ""]
        t = self.tuned
        if t is None:
            lines.append(f"- not tuned: {self.not_tuned}")
        else:
            ref = t.torch_fp32_tokens_per_s
            lines.append(f"- Winner: `{t.winner}` at {t.tokens_per_s:,.0f} tokens/s")
            if ref and t.vs_torch_fp32:
                lines.append(f"- torch fp32: {ref:,.0f} tokens/s; {t.vs_torch_fp32:.2f}x")
            lines.append(f"- Profile: `{t.profile_file}`; tune report: `{t.tune_report}`")
        lines += ["", "## Time", ""]
        lines += [f"- {k}: {v:.1f} s" for k, v in self.seconds.items()]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path) -> tuple[Path, Path]:
        """``<directory>/add-<model>.md`` and ``.json``, each written at once."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = "add-" + self.model.replace("/", "--")
        md, js = directory / f"{stem}.md", directory / f"{stem}.json"
        _atomic(md, self.markdown())
        _atomic(js, json.dumps(self.to_dict(), indent=2) + "\n")
        return md, js


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
