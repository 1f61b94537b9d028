"""How a Settings field becomes a flag, an env variable and a value.

``setting()`` declares a field (default, help, secrecy, groups); ``add_arguments``
gives a command the flags of its groups; ``layered`` reads defaults < config file <
``FLEETSERVE_*`` env < CLI flags < overrides into typed values.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from .yamlio import load_yaml

ENV_PREFIX = "FLEETSERVE_"


# the groups of a field that declares none: the serving commands show it
SERVING = "serving"


def setting(
    default: Any,
    help: str,
    *,
    secret: bool = False,
    flag: str | None = None,
    groups: str = SERVING,
) -> Any:
    """A Settings field: its default, help text, whether to redact it, and the groups
    it belongs to (space-separated; a command's ``--help`` shows the flags of its
    groups, see ``cli_groups.COMMAND_GROUPS``)."""
    meta = {"help": help, "secret": secret, "flag": flag, "groups": tuple(groups.split())}
    return field(default=default, metadata=meta)


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(f: dataclasses.Field[object]) -> str:
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def add_arguments(
    all_fields: Sequence[dataclasses.Field[object]],
    parser: argparse.ArgumentParser,
    groups: Iterable[str] | None = None,
    shown: Collection[str] | None = None,
) -> int:
    """One flag per field of ``groups`` (all if None), under a heading per group, in
    the command's order; unset flags stay ``None`` so lower layers show through.
    ``shown``: the fields whose flags ``--help`` lists (None: all); the others work
    the same, unlisted. Returns how many flags are left unlisted."""
    hidden = 0
    wanted = None if groups is None else list(groups)
    chosen: dict[str, list[dataclasses.Field[object]]] = {}  # heading -> its fields
    for f in all_fields:
        own = f.metadata.get("groups") or (SERVING,)
        if wanted is None:
            chosen.setdefault("", []).append(f)
        elif set(own) & set(wanted):
            chosen.setdefault(next(g for g in wanted if g in own), []).append(f)
    for name in [g for g in (wanted or [""]) if g in chosen]:  # in the command's order
        heading = parser.add_argument_group(GROUP_TITLES.get(name, name)) if name else parser
        for f in chosen[name]:
            text = f"{f.metadata['help']} [env {env_name(f.name)}; default {f.default!r}]"
            listed = shown is None or f.name in shown
            hidden += not listed
            # a boolean flag alone means true (--train); --train false also reads
            switch: dict[str, Any] = (
                {"nargs": "?", "const": True} if _scalar_type(f) is _parse_bool else {}
            )
            heading.add_argument(
                flag_name(f),
                dest=f.name,
                type=_scalar_type(f),
                default=None,
                metavar=_METAVARS.get(_scalar_type(f), "TEXT"),
                # argparse formats help with %
                help=text.replace("%", "%%") if listed else argparse.SUPPRESS,
                **switch,
            )
    return hidden


def layered(
    all_fields: Sequence[dataclasses.Field[object]],
    env: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The typed values of the fields that some layer sets."""
    env = env or {}
    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    values: dict[str, Any] = {}
    config_path = cli.get("config") or env.get(env_name("config"))
    if config_path:
        values.update(_read_config(Path(config_path)))
    for f in all_fields:
        raw = env.get(env_name(f.name))
        if raw is not None:
            values[f.name] = raw
    values.update(cli)
    values.update(overrides or {})
    unknown = set(values) - {f.name for f in all_fields}
    if unknown:
        raise ValueError(f"unknown settings: {', '.join(sorted(unknown))}")
    return {f.name: _coerce(f, values[f.name]) for f in all_fields if f.name in values}


GROUP_TITLES = {
    "common": "logging and config",
    "http": "HTTP",
    "client": "the server to talk to",
    "catalog": "catalog and profiles",
    "device": "device",
    "runtime": "models and memory",
    "quick": "tuning (at start, or in the background)",
    "gateway": "requests",
    "auth": "API keys",
    "keys": "keys file",
    "adapters": "LoRA adapters",
    "training": "fine-tuning jobs",
    "tuning": "tuning runs",
    "nats": "NATS JetStream",
    "dlq": "replay",
    "pool": "this worker",
    "payloads": "payload offload",
    "s3": "S3 (s3:// stores and sources)",
    SERVING: "other settings",
}


def _scalar_type(f: dataclasses.Field[object]) -> Callable[[str], object]:
    t = f.type if not isinstance(f.type, str) else _resolve(f.type)
    convs: dict[object, Callable[[str], object]] = {int: int, float: float, bool: _parse_bool}
    return convs.get(t, str)


def _resolve(name: str) -> type:
    return {"int": int, "float": float, "bool": bool, "str": str}.get(name, str)


def _parse_bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {v!r}")


_METAVARS: dict[Callable[[str], object], str] = {
    int: "N",
    float: "NUM",
    _parse_bool: "BOOL",
    str: "TEXT",
}


def _coerce(f: dataclasses.Field[object], value: Any) -> Any:
    conv = _scalar_type(f)
    try:
        return conv(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"setting {f.name}: cannot read {value!r} ({exc})") from None


def _read_config(path: Path) -> dict[str, Any]:
    data = load_yaml(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
