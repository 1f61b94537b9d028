"""YAML in, through libyaml where PyYAML was built with it (5x faster than the pure
Python loader on the bundled catalog and profiles, read at every start and by each
``fleetserve`` command), with the same safe subset either way."""

from __future__ import annotations

from typing import Any

import yaml

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # (no common base class)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, through libyaml when it is there (raises ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=_Loader)


__all__ = ["load_yaml"]
