"""The simulation's cost models, and whether each was fitted or assumed.

- ``cpu``: the cost coefficients of a tuned CPU profile (``catalog/profiles/cpu-*/``),
  which ``fleetserve tune`` fitted on that machine (``tune.costfit``): **fitted**.
- ``gpu``: a tuned ``cuda-*`` profile if one is given (``--profile-dir``, for example
  the ``profiles/`` that ``benchmarks/gpu.sh`` writes) or bundled: **fitted**. Otherwise the
  model spec's ``budgets: cuda`` starting points, which no GPU run has fitted:
  **assumed**, and every report says so.

Budgets and ``interactive_cost`` come from the same profile, and the interactive cap
from ``catalog.profiles.Choice.interactive_batch_tokens`` as the worker reads it (a
tuned profile with no ``priority_cap``: a batch of about 25 ms by its fitted costs; an
untuned one: no cap).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...catalog import Catalog
from ...catalog.profiles import Choice, bundled_dir, profile_path, read_profile_file
from ...catalog.spec import Profile
from .params import DEFAULT_MODEL, Params

COST_MODELS = ("cpu", "gpu")
_KIND = {"cpu": ("cpu", "cpu"), "gpu": ("cuda", "cuda")}  # name: (class prefix, budgets key)


@dataclass(frozen=True)
class CostSource:
    """Where one cost model's coefficients came from."""

    name: str  # cpu, gpu
    profile: Profile
    fitted: bool
    source: str  # a sentence: which file or spec entry, fitted when and on what
    provenance: dict[str, Any]
    how: str  # as Profiles.choose would say: tuned (a profile file) or catalog (the spec)

    @property
    def interactive_tokens(self) -> int:
        """The batch cap while interactive work is about, as the worker reads it."""
        return Choice(self.profile, self.how, self.source).interactive_batch_tokens


def _classes(root: Path, prefix: str) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix))


def find_cost(
    name: str, model: str = DEFAULT_MODEL, profile_dir: Path | None = None, cls: str = ""
) -> CostSource:
    """The ``cpu`` or ``gpu`` cost model for ``model``: a tuned profile (``cls``, or the
    first class of that kind found in ``profile_dir``, then in the bundled profiles),
    else the spec's budgets for the kind."""
    if name not in _KIND:
        raise ValueError(f"cost model must be one of {', '.join(COST_MODELS)}, not {name!r}")
    prefix, kind = _KIND[name]
    roots = [r for r in (profile_dir, bundled_dir()) if r is not None]
    for root in roots:
        for c in [cls] if cls else _classes(root, prefix):
            path = profile_path(root, model, c)
            if not path.is_file():
                continue
            pf = read_profile_file(path, c, bundled=root == bundled_dir())
            prov = pf.provenance
            fitted = prov.get("written_by") == "fleetserve tune"
            when = f"{prov.get('date', '?')} on {prov.get('machine', '?')}"
            err = (prov.get("figures") or {}).get("cost_fit_error")
            fit = f", held-out median error {err:.0%}" if isinstance(err, int | float) else ""
            how = f"fitted by fleetserve tune {when}{fit}" if fitted else "not written by tune"
            src = f"{model} profile {c} ({how})"
            return CostSource(name, pf.profile, fitted, src, prov, "tuned")
    if cls:
        raise ValueError(f"no profile for {model} on hardware class {cls!r}")
    spec = Catalog.load().get(model)
    prof = Profile.from_dict(kind, spec.budgets.get(kind, {}))
    why = f"{model} spec budgets {kind!r}: starting points, no tuned {prefix}-* profile"
    return CostSource(name, prof, False, why, {}, "catalog")


def params_for(cs: CostSource, max_seq_len: int, **kw: Any) -> Params:
    """Params with ``cs``'s coefficients, budgets and priority settings."""
    p = cs.profile
    return Params(
        cost=p.cost,
        cost_source=cs.source,
        cost_name=cs.name,
        cost_fitted=cs.fitted,
        max_batch_tokens=p.max_batch_tokens,
        max_batch_size=p.max_batch_size,
        max_seq_len=max_seq_len,
        interactive_cost=p.interactive_cost,
        interactive_tokens=cs.interactive_tokens,
        priority_cap=p.priority_cap,
        **kw,
    )


def from_catalog(
    name: str = "cpu",
    model: str = DEFAULT_MODEL,
    profile_dir: Path | None = None,
    cls: str = "",
    **kw: Any,
) -> Params:
    """Params for the ``cpu`` or ``gpu`` cost model of ``model`` (see ``find_cost``)."""
    spec = Catalog.load().get(model)
    return params_for(find_cost(name, model, profile_dir, cls), spec.max_seq_len, **kw)
