"""``fleetserve keys``: make API keys and list the keys file.

``keys add --tenant T --scopes infer,adapters:write [--name N] [--file PATH]`` makes a
random key, appends its SHA-256 (with the tenant, scopes and name) to the keys file
(``--file``, else the ``keys_file`` setting) and prints the key once, on stdout: only
its hash is stored. Running servers read the keys file at start; restart them to use
the new key. ``keys list`` shows the entries (names, tenants, scopes, hash prefixes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

import yaml

from .cli_groups import add_settings
from .gateway.auth import (
    KeyEntry,
    check_tenant,
    hash_key,
    new_key,
    parse_keys,
    parse_scopes,
    read_keys_file,
)
from .settings import Settings
from .yamlio import load_yaml

# the argparse dests of this command that are not Settings fields
ARGS = frozenset({"key_tenant", "key_scopes", "key_name", "key_file"})


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser(
        "keys",
        help="API keys: add one (printed once, stored hashed in the keys file), or list them.",
        usage="fleetserve keys {add,list} [--tenant T] [--scopes S] [options]",
    )
    keys.add_argument("action", choices=["add", "list"])
    keys.add_argument(
        "--tenant", dest="key_tenant", default=None, help="The key's tenant (add; required)."
    )
    keys.add_argument(
        "--scopes",
        dest="key_scopes",
        default="infer",
        help="Comma-separated scopes: infer, adapters:write, metrics, admin (add) [infer].",
    )
    keys.add_argument("--name", dest="key_name", default="", help="A label for the key (add).")
    keys.add_argument(
        "--file",
        dest="key_file",
        default=None,
        help="The keys file (default: the keys_file setting); created if missing.",
    )
    add_settings(keys, "keys")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """``ValueError`` or ``OSError`` for a problem (the CLI prints it on one line)."""
    path = _keys_path(args.key_file, settings)
    if args.action == "list":
        return _list(path)
    if not args.key_tenant:
        raise ValueError("keys add needs --tenant")
    entry, key = add_key(
        path, tenant=args.key_tenant, scopes=args.key_scopes, name=args.key_name or ""
    )
    print(key)  # stdout: the key alone, so that KEY=$(fleetserve keys add ...) works
    scopes = ",".join(entry.to_dict()["scopes"])
    print(
        f"new API key for tenant {entry.tenant!r} (scopes {scopes}) added to {path} as its "
        "sha256. The key is shown once and not stored: keep it now. Restart running "
        "servers to use it.",
        file=sys.stderr,
    )
    return 0


def add_key(path: Path, *, tenant: str, scopes: str, name: str = "") -> tuple[KeyEntry, str]:
    """Append a new key's entry to the keys file at ``path`` (created if missing);
    returns the entry and the key, which is stored nowhere."""
    key = new_key()
    entry = KeyEntry(
        sha256=hash_key(key),
        tenant=check_tenant(tenant, "--tenant"),
        scopes=parse_scopes(scopes, "--scopes"),
        name=name,
    )
    source = f"keys file {path}"
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = ""
    entries = parse_keys(old, source)  # a broken file stays as it is
    if any(e.sha256 == entry.sha256 for e in entries):  # pragma: no cover - 256 random bits
        raise ValueError(f"{source}: a key with this hash exists already")
    _write(path, _appended(old, entries, entry, source))
    return entry, key


def _appended(old: str, entries: list[KeyEntry], entry: KeyEntry, source: str) -> str:
    """The file with ``entry`` added: as text at the end where that keeps it a valid
    list (comments stay), else the whole document rewritten."""
    item = yaml.safe_dump([entry.to_dict()], sort_keys=False, default_flow_style=False)
    if old.strip():
        text = old + ("" if old.endswith("\n") else "\n") + item
        with contextlib.suppress(ValueError):
            if parse_keys(text, source) == [*entries, entry]:
                return text
    doc = [e.to_dict() for e in [*entries, entry]]
    data: object = doc
    if old.strip() and isinstance(load_yaml(old), dict):
        data = {"keys": doc}
    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def _write(path: Path, text: str) -> None:
    """Replace the file atomically, keeping its mode (a new one: owner only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _list(path: Path) -> int:
    entries = read_keys_file(path)
    for e in entries:
        scopes = ",".join(e.to_dict()["scopes"])
        print(f"{e.sha256[:12]}  {e.tenant:<20} {scopes:<28} {e.name}")
    print(f"{len(entries)} key(s) in {path}", file=sys.stderr)
    return 0


def _keys_path(flag: str | None, settings: Settings) -> Path:
    raw = flag or settings.keys_file
    if not raw:
        raise ValueError(
            "no keys file: pass --file PATH, or set --keys-file / FLEETSERVE_KEYS_FILE"
        )
    return Path(raw).expanduser()


__all__ = ["ARGS", "add_key", "add_parser", "run"]
