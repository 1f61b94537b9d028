"""Which profile each model runs with on this machine, and why.

Lookup for a model on hardware class C (``fleetserve hardware`` shows C):

1. **tuned** for C: your profile directory (``--profile-dir``), then the profiles
   bundled in the package (``catalog/profiles/C/``), both written by ``fleetserve tune``;
2. **catalog**: a profile the model's spec declares for C, or for its kind
   (``cpu``, ``cuda``): your own catalog's explicit choice;
3. **fallback**: a tuned profile of the next class in C's fallback chain
   (``catalog.rules.fallback_chain``);
4. **rule**: the table the bundled profiles' winners make (``catalog.evidence``), read
   for this machine's class or the nearest by features (``catalog.rules``).

A profile file is YAML with ``model``, ``hardware_class``, ``profile`` (the fields of
:class:`~fleetserve.catalog.spec.Profile`) and ``provenance`` (who wrote it, when, on
what, with which figures). It lives at ``<dir>/<class>/<model id, / as -->.yaml``. A
file that does not parse stops start-up with its path and the field named.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..yamlio import load_yaml
from . import Catalog
from .evidence import Row, RuleTable
from .hardware import Hardware, judged_features
from .rules import fallback_chain, missing_extra, rule_profile
from .spec import ModelSpec, Profile

log = logging.getLogger("fleetserve.catalog")

FILE_KEYS = ("model", "hardware_class", "profile", "provenance")
HOW = ("tuned", "catalog", "fallback", "rule")


class ProfileError(ValueError):
    """A profile file that cannot be used: names the file and the field."""


@dataclass(frozen=True)
class ProfileFile:
    model: str
    hardware_class: str
    profile: Profile
    provenance: dict[str, Any]
    path: Path
    bundled: bool


@dataclass(frozen=True)
class Choice:
    """The profile a model runs with, how it was found, and a sentence saying why."""

    profile: Profile
    how: str  # one of HOW
    reason: str
    file: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)
    bundled: bool = False  # the profile file ships with the package

    @property
    def interactive_batch_tokens(self) -> int:
        """The batch budget while interactive work waits: the profile's ``priority_cap``;
        for a tuned profile written before it had one, the same rule from its fitted
        cost model; otherwise no cap (a cost model nobody fitted is no evidence)."""
        p = self.profile
        cap = p.priority_cap
        if not cap and self.how == "tuned":
            cap = p.cost.interactive_cap(p.max_batch_tokens)
        return max(1, min(cap or p.max_batch_tokens, p.max_batch_tokens))

    def describe(self) -> dict[str, object]:
        """For ``GET /v1/models`` and ``fleetserve models``."""
        out: dict[str, object] = {
            "hardware_class": self.profile.hardware,
            "how": self.how,
            "reason": self.reason,
        }
        if self.file:
            out["file"] = self.file
        if self.provenance.get("date"):
            out["tuned_on"] = self.provenance["date"]
        return out


def slug(model_id: str) -> str:
    return model_id.replace("/", "--")


def bundled_dir() -> Path:
    return Path(str(resources.files(__package__) / "profiles"))


def evidence_rows(files: Iterable[ProfileFile], catalog: Catalog) -> list[Row]:
    """The rows a table is made of; a profile of a model not in ``catalog`` is left out."""
    rows: list[Row] = []
    for f in files:
        if f.model not in catalog:
            continue
        spec = catalog.get(f.model)
        prov = f.provenance
        figures = prov.get("figures")
        ratio = figures.get("vs_torch_fp32") if isinstance(figures, dict) else None
        feats = prov.get("features")
        rows.append(
            Row(
                f.hardware_class,
                f.model,
                spec.family,
                f.profile.runtime or spec.runtime,
                f.profile.precision,
                float(ratio) if isinstance(ratio, int | float) else None,
                str(prov.get("report") or ""),
                frozenset(map(str, feats)) if isinstance(feats, list) else frozenset(),
            )
        )
    return rows


def evidence_table(bundled: Path | None = None) -> RuleTable:
    """The rules' table from every class's bundled profiles (``bundled``: the
    package's unless given)."""
    root = bundled or bundled_dir()
    if not root.is_dir():
        return RuleTable()
    files = [
        read_profile_file(f, d.name, bundled=True)
        for d in sorted(root.iterdir())
        if d.is_dir()
        for f in sorted(d.glob("*.yaml"))
    ]
    return RuleTable(evidence_rows(files, Catalog.load()))


class Profiles:
    """The tuned profiles for one hardware class and its fallbacks, read once."""

    def __init__(
        self,
        hw: Hardware,
        hardware_class: str = "",
        user_dir: Path | None = None,
        bundled: Path | None = None,
        *,
        unbundled: bool = False,
    ) -> None:
        """``bundled``: the package's profiles unless given (tests give their own);
        ``unbundled``: as if nothing were bundled for this class (its tunes out of the
        rules' evidence too), to measure what a class with none gets."""
        self.hw = hw
        self.hardware_class = hardware_class or hw.hardware_class
        self.chain = fallback_chain(self.hardware_class)
        self.user_dir = user_dir.expanduser() if user_dir else None
        self.table = evidence_table(bundled)
        if unbundled:
            self.table = self.table.without(self.hardware_class)
        self.features = judged_features(hw, self.hardware_class)
        self._files: dict[tuple[str, str], ProfileFile] = {}
        self.ignored: list[str] = []  # the user's files that do not parse
        for cls in (self.hardware_class, *self.chain):
            own = unbundled and cls == self.hardware_class
            for root, is_bundled in ((None if own else bundled or bundled_dir(), True),
                                     (self.user_dir, False)):  # fmt: skip
                if root is None or not (root / cls).is_dir():
                    continue
                for f in sorted((root / cls).glob("*.yaml")):
                    try:
                        pf = read_profile_file(f, cls, is_bundled)
                    except ProfileError as exc:
                        if is_bundled:
                            raise  # the package is broken: its tests catch it
                        # one line, and the model runs as if the file were not there
                        # (--tune auto tunes it again and writes it afresh)
                        log.warning("ignoring a profile of yours: %s", exc)  # (exc names the file)
                        self.ignored.append(str(f))
                        continue
                    self._files[pf.model, cls] = pf  # the user's file, read last, wins

    def tuned(self, model_id: str, hardware_class: str = "") -> ProfileFile | None:
        return self._files.get((model_id, hardware_class or self.hardware_class))

    def choose(self, spec: ModelSpec) -> Choice:
        cls = self.hardware_class
        skipped: list[str] = []  # bundled profiles this install cannot run
        pf = self._usable(spec, cls, skipped)
        if pf is not None:
            where = "bundled" if pf.bundled else "yours"
            date = pf.provenance.get("date", "?")
            reason = f"tuned for {cls} ({where}, {date})"
            return Choice(pf.profile, "tuned", reason, str(pf.path), pf.provenance, pf.bundled)
        note = "".join(f"; {s}" for s in skipped)
        kind = "cuda" if cls.startswith("cuda") else "cpu"
        for key in (cls, kind):
            if key in spec.profiles:
                declared = spec.profiles[key]
                reason = f"declared in the model's spec for {key}{note}"
                return Choice(declared, "catalog", reason)
        pick = self.table.pick(spec.family, cls, self.features)
        for other in self.chain:
            pf = self._usable(spec, other, skipped)
            if (  # the nearest evidence won at another precision, native here
                pf is not None
                and pick
                and pick.source != other
                and pick.precision != pf.profile.precision
            ):
                skipped.append(
                    f"{other}'s profile runs {pf.profile.precision}; {pick.source}'s "
                    f"tunes, the nearest evidence for this CPU, won at {pick.precision}"
                )
                continue
            if pf is not None:
                reason = f"fallback: tuned for {other}, which stands in for {cls}{note}"
                return Choice(pf.profile, "fallback", reason, str(pf.path), pf.provenance)
        note = "".join(f"; {s}" for s in skipped)
        profile, why = rule_profile(spec, self.hw, cls, self.table)
        return Choice(
            profile, "rule", f"rule: {why}{note}; `fleetserve tune {spec.id}` would tune it"
        )

    def _usable(self, spec: ModelSpec, cls: str, skipped: list[str]) -> ProfileFile | None:
        """The tuned file for ``spec`` on ``cls``. A bundled one whose runtime's extra is
        not installed is passed over (yours is kept: it then fails to load, naming it)."""
        pf = self.tuned(spec.id, cls)
        if pf is None or not pf.bundled:
            return pf
        runtime = pf.profile.runtime or spec.runtime
        extra = missing_extra(runtime)
        if extra:
            skipped.append(
                f"the bundled profile for {cls} runs {runtime}, not installed here "
                f"(pip install 'fleetserve[{extra}]')"
            )
            return None
        return pf


def read_profile_file(path: Path, hardware_class: str = "", bundled: bool = False) -> ProfileFile:
    """Parse one profile file; any problem is a :class:`ProfileError` naming the field."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProfileError(f"profile file {path}: cannot read it ({detail})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path}: must be a mapping with {', '.join(FILE_KEYS)}")
    unknown = sorted(set(data) - set(FILE_KEYS))
    if unknown:
        raise ProfileError(f"profile file {path}: unknown field {unknown[0]!r}")
    for key in ("model", "hardware_class", "profile"):
        if data.get(key) is None or data.get(key) == "":
            raise ProfileError(f"profile file {path}: field {key!r} is missing")
    cls = str(data["hardware_class"])
    if hardware_class and cls != hardware_class:
        raise ProfileError(
            f"profile file {path}: field 'hardware_class' is {cls!r} but the file sits "
            f"under {hardware_class}/"
        )
    try:
        profile = Profile.from_dict(cls, data["profile"] or {})
    except ValueError as exc:
        raise ProfileError(f"profile file {path}: {exc}") from None
    provenance = data.get("provenance") or {}
    if not isinstance(provenance, dict):
        raise ProfileError(f"profile file {path}: field 'provenance' must be a mapping")
    return ProfileFile(str(data["model"]), cls, profile, provenance, path, bundled)


def profile_path(root: Path, model_id: str, hardware_class: str) -> Path:
    return root.expanduser() / hardware_class / f"{slug(model_id)}.yaml"


def write_profile_file(
    root: Path, model_id: str, profile: Profile, provenance: dict[str, Any], header: str = ""
) -> Path:
    """Write ``root/<class>/<slug>.yaml`` atomically: a crash leaves the old file or none."""
    doc = {
        "model": model_id,
        "hardware_class": profile.hardware,
        "profile": profile.to_dict(),
        "provenance": provenance,
    }
    text = "".join(f"# {line}\n" for line in header.splitlines())
    text += yaml.safe_dump(doc, sort_keys=False, width=88)
    return write_profile_text(root, model_id, profile.hardware, text)


def write_profile_text(root: Path, model_id: str, hardware_class: str, text: str) -> Path:
    """Write a profile file's ``text`` (one another worker tuned) atomically, once it
    parses as a profile of ``model_id`` for ``hardware_class``."""
    dest = profile_path(root, model_id, hardware_class)
    folder = dest.parent
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        pf = read_profile_file(tmp, hardware_class)  # never leave a file that would not load
        if pf.model != model_id:
            raise ProfileError(f"{tmp}: a profile of {pf.model}, not {model_id}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


__all__ = [
    "HOW",
    "Choice",
    "ProfileError",
    "ProfileFile",
    "Profiles",
    "bundled_dir",
    "evidence_rows",
    "evidence_table",
    "profile_path",
    "read_profile_file",
    "slug",
    "write_profile_file",
    "write_profile_text",
]
