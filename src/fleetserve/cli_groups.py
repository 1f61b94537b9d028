"""The Settings groups each command takes: ``fleetserve <command> --help`` lists those
flags only. Beside ``cli.py`` and below it, for the subcommands defined in their own
modules (``cli_keys.py``, ``cli_lora.py``), which ``cli.py`` imports."""

from __future__ import annotations

import argparse

from .settings import Settings

# the Settings groups (settings.py, per field) whose flags each command takes and shows
_SERVING = ("catalog", "adapters", "training", "s3")
_LAST = ("serving", "common")  # other settings (tracing...), then logging and config
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "serve": ("http", "gateway", "auth", "runtime", "quick", *_SERVING, *_LAST),
    "gateway": ("http", "gateway", "auth", "nats", "payloads", *_SERVING, *_LAST),
    "worker": ("pool", "runtime", "nats", "payloads", *_SERVING, "quick", *_LAST),
    "cluster": (
        "http",
        "gateway",
        "auth",
        "pool",
        "runtime",
        "nats",
        "payloads",
        *_SERVING,
        *_LAST,
    ),
    "dlq": ("nats", "dlq", "common"),
    "models": ("client", "catalog", "device", "s3", "common"),
    "keys": ("keys", "common"),
    "lora": ("client", "common"),
    "tune": ("catalog", "device", "tuning", "s3", "common"),
    "add": ("catalog", "device", "tuning", "s3", "client", "common"),
    "hardware": ("catalog", "device", "common"),
}


# the flags ``--help`` lists for the serving commands (``--help-all`` lists them all)
COMMON = frozenset(
    {"host", "port", "catalog", "models", "device", "devices", "memory_budget", "tune",
     "api_key", "keys_file", "nats", "log_level", "log_format", "config", "worker_port",
     "cache_dir", "profile_dir"}
)  # fmt: skip
_SHORTENED = frozenset({"serve", "gateway", "worker", "cluster"})


def add_settings(parser: argparse.ArgumentParser, command: str, show_all: bool = False) -> None:
    """The Settings flags of ``command``'s groups (its ``--help`` lists only those): for
    the serving commands the common ones, with ``--help-all`` for the rest."""
    shown = None if show_all or command not in _SHORTENED else COMMON
    hidden = Settings.add_arguments(parser, COMMAND_GROUPS[command], shown)
    if command in _SHORTENED:
        parser.add_argument("--help-all", action="help", help="Show every flag and exit.")
    if hidden:
        parser.epilog = f"{hidden} more flags: fleetserve {command} --help-all lists them."
