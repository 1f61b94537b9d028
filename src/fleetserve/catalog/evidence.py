"""The rules' table, derived from the bundled profiles' winners.

Every bundled profile was written by ``fleetserve tune`` on a machine whose features it
records (``provenance.features``), with the winner's ratio to torch fp32. This module
turns those files into the table the rules read: for a hardware class and a *group* of
families (the encoders that convert to OpenVINO, or one other family such as
``generate``), which runtime and precision won there, and the rows behind it. Where
the class has rows of the model's own family, those decide (the quality gates differ by
family); otherwise the whole group's do, and the gate at load has the last word.

A class with no rows of its own takes the **nearest class by features**: first one whose
winning precision this machine can run (bf16 needs ``amx_bf16`` or ``avx512_bf16``,
fp16 needs ``avx512_fp16``), a reduced precision before fp32 (the instructions that win
are the features that matter most), then the fewest features differing, then the name. Where the
nearest class's precision cannot run here, its runtime is kept at fp32, and the reason
says so. Nothing here is hand-written: a new bundled profile changes the table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import median

# the families whose winners are pooled: they all convert to OpenVINO and share shapes
ENCODER_FAMILIES = frozenset(
    {"dense", "sparse", "multivector", "cross_encoder", "ner", "zero_shot"}
)
# a precision -> the CPU features any one of which runs it natively
NATIVE = {
    "fp32": frozenset(),
    "bf16": frozenset({"amx_bf16", "avx512_bf16"}),
    "fp16": frozenset({"avx512_fp16", "amx_fp16"}),
}


def group(family: str) -> str:
    """The rows a family's rule is read from: ``encoder`` or the family itself."""
    return "encoder" if family in ENCODER_FAMILIES else family


def runs_natively(precision: str, features: Iterable[str]) -> bool:
    need = NATIVE.get(precision)
    return need is None or not need or bool(need & set(features))


@dataclass(frozen=True)
class Row:
    """One bundled profile, as evidence."""

    hardware_class: str
    model: str
    family: str
    runtime: str
    precision: str
    vs_torch_fp32: float | None
    report: str
    features: frozenset[str]


@dataclass(frozen=True)
class Pick:
    """What the table says for one model on one machine, and why."""

    runtime: str
    precision: str
    source: str  # the class whose rows decided
    rows: tuple[Row, ...]
    reason: str


def _own(rows: tuple[Row, ...], family: str) -> tuple[Row, ...]:
    """The rows of ``family`` itself where its class has any, else the whole group's:
    the gates differ by family (bf16 passes for dense, fails for sparse on cpu-amx)."""
    return tuple(r for r in rows if r.family == family) or rows


def _arch(hardware_class: str) -> str:
    if hardware_class.startswith("cuda"):
        return "cuda"
    return "arm64" if hardware_class == "cpu-arm64" else "x86"


class RuleTable:
    """Rows grouped by class; :meth:`pick` answers for a machine."""

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        self.rows = tuple(sorted(rows, key=lambda r: (r.hardware_class, r.model)))

    def without(self, hardware_class: str) -> RuleTable:
        """The table as a machine of ``hardware_class`` would see it had nothing been
        tuned there: how the nearest-class rule is measured on a class that has rows."""
        return RuleTable(r for r in self.rows if r.hardware_class != hardware_class)

    def classes(self, family: str) -> dict[str, tuple[Row, ...]]:
        """The rows of ``family``'s group, by class."""
        return self._by_class(group(family))

    def _by_class(self, g: str) -> dict[str, tuple[Row, ...]]:
        out: dict[str, list[Row]] = {}
        for r in self.rows:
            if group(r.family) == g:
                out.setdefault(r.hardware_class, []).append(r)
        return {c: tuple(rs) for c, rs in out.items()}

    @staticmethod
    def winner(rows: tuple[Row, ...]) -> tuple[str, str]:
        """The (runtime, precision) most rows chose; a tie goes to the higher median
        ratio to torch fp32."""
        votes = Counter((r.runtime, r.precision) for r in rows)

        def key(choice: tuple[str, str]) -> tuple[int, float]:
            ratios = [r.vs_torch_fp32 for r in rows if (r.runtime, r.precision) == choice]
            known = [x for x in ratios if x is not None]
            return votes[choice], median(known) if known else 0.0

        return max(votes, key=key)

    def pick(self, family: str, hardware_class: str, features: Iterable[str]) -> Pick | None:
        """The table's runtime and precision for ``family`` on a machine of
        ``hardware_class`` with ``features``; None when no class of its kind has rows."""
        mine = frozenset(features)
        by_class = {
            c: rs for c, rs in self.classes(family).items() if _arch(c) == _arch(hardware_class)
        }
        if not by_class:
            return None
        if hardware_class in by_class:
            rows = _own(by_class[hardware_class], family)
            runtime, precision = self.winner(rows)
            return Pick(runtime, precision, hardware_class, rows, f"as tuned on {hardware_class}")

        def distance(cls: str) -> tuple[bool, bool, int, str]:
            rows = by_class[cls]
            seen = frozenset().union(*(r.features for r in rows))
            won = self.winner(rows)[1]
            # a winner this CPU runs natively first, a reduced precision before fp32
            # (the instructions that win are the features that matter most)
            return not runs_natively(won, mine), won == "fp32", len(seen ^ mine), cls

        nearest = min(by_class, key=distance)
        rows = _own(by_class[nearest], family)
        runtime, precision = self.winner(rows)
        reason = f"as tuned on {nearest}, the nearest class by features"
        if not runs_natively(precision, mine):
            reason += f", at fp32: this CPU has no native {precision}"
            precision = "fp32"
        return Pick(runtime, precision, nearest, rows, reason)

    def markdown(self) -> str:
        """The table with its evidence, as ``docs/tuning.md`` shows it: each bundled
        tune, then what a family with no tune of its own on that class gets."""
        lines = [
            "| class | model | family | winner | x torch fp32 | report |",
            "| --- | --- | --- | --- | ---: | --- |",
        ]
        for r in self.rows:
            ratio = f"{r.vs_torch_fp32:.2f}" if r.vs_torch_fp32 else "-"
            name = r.report.rsplit("/", 1)[-1]
            report = f"[{name}]({r.report.removeprefix('docs/')})" if r.report else "-"
            lines.append(
                f"| `{r.hardware_class}` | {r.model} | {r.family} | {r.runtime} {r.precision} "
                f"| {ratio} | {report} |"
            )
        lines += ["", "| class | group | the rule for a family with no tune there |"]
        lines.append("| --- | --- | --- |")
        for g in sorted({group(r.family) for r in self.rows}):
            for cls, rows in sorted(self._by_class(g).items()):
                runtime, precision = self.winner(rows)
                tunes = f"{len(rows)} tune" + ("s" if len(rows) > 1 else "")
                lines.append(f"| `{cls}` | {g} | {runtime} {precision} ({tunes}) |")
        return "\n".join(lines) + "\n"


__all__ = ["ENCODER_FAMILIES", "NATIVE", "Pick", "Row", "RuleTable", "group", "runs_natively"]
