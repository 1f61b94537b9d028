"""fleetserve's one log style, for every command and child process.

A line is ``HH:MM:SS LEVEL [tag] logger: message key=value ...``; with
``log_format: json`` it is one JSON object per line instead (``ts``, ``level``,
``logger``, ``msg``, the fields). Fields ride on a record as ``extra=kv(...)``.

Everything goes through the root logger, so uvicorn's, transformers' and the other
libraries' records come out in the same style. Secrets never do: the values of the
Settings fields marked ``secret``, URL credentials, bearer tokens and fleetserve API
keys are replaced by ``***`` in every line. Third-party progress bars (transformers,
huggingface_hub, datasets) are turned off through their own APIs as those libraries
are imported, and child processes get the same through their spawn environment.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import TextIO
from urllib.parse import urlsplit

from ..settings import Settings
from .quiet import LibraryNoise, install_quieting

FIELDS = "fleetserve_fields"  # the LogRecord attribute that carries key=value fields
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
# the environment child processes get, so that libraries draw no bars there either
CHILD_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
# libraries that talk too much at info
_QUIET = ("httpx", "httpcore", "urllib3", "filelock", "sentence_transformers", "asyncio")
_SERVERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "granian")
# Every pattern is linear in the line's length (a bounded scheme, no nested or
# overlapping repeats): a client controls parts of what is logged, and one quadratic
# pattern on a long line would stall the event loop.
# user:password@ or token@ in any URL (nats://tok3n@host): the host stays readable
_URL_CREDS = re.compile(r"""(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://)[^/\s@"'<>]+@""")
# an Authorization header's value, whatever its scheme (``Authorization: Basic ...``)
_AUTH_HEADER = re.compile(
    r"""(?i)(?P<head>\b(?:proxy-)?authorization["']?\s{0,8}[:=]\s{0,8}["']?)"""
    r"""(?P<scheme>[A-Za-z]{1,16} )?[^\s"',;]+"""
)
# a bearer token anywhere else: ``Bearer`` and 16 or more token characters
_BEARER = re.compile(r"(?i)\b(?P<word>bearer)\s{1,8}[A-Za-z0-9._~+/=-]{16,}")
# fleetserve's own keys: "fs-" and secrets.token_urlsafe(32) (gateway.auth.new_key)
_API_KEY = re.compile(r"(?<![A-Za-z0-9_-])fs-[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
FIELD_MAX = 1024  # a field's value is cut to this many characters (a client may send MBs)
_SHORT = {"W": "WARN", "C": "CRIT"}
_COLORS = {"DEBUG": "2", "INFO": "32", "WARN": "33", "ERROR": "31", "CRIT": "31;1"}


def kv(**values: object) -> dict[str, object]:
    """``extra=`` for a log call: ``log.info("loaded %s", m, extra=kv(ms=12))``."""
    return {FIELDS: values}


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a child process, with the libraries' progress bars turned off."""
    return {**env, **CHILD_ENV}


class Redactor:
    """Replaces secrets in log text: known values, URL credentials, bearer tokens and
    fleetserve API keys (``fs-...``)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        """The secret fields' values; of a URL, only its password and user (its host
        stays readable)."""
        found: list[str] = []
        for f in fields(settings):
            value = getattr(settings, f.name)
            if not f.metadata.get("secret") or not isinstance(value, str) or not value:
                continue
            found.extend(_url_secrets(value) if "://" in value else [value])
        return cls(found)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, "***")
        text = _URL_CREDS.sub(r"\g<scheme>***@", text)
        text = _AUTH_HEADER.sub(lambda m: m["head"] + (m["scheme"] or "") + "***", text)
        text = _BEARER.sub(lambda m: m["word"] + " ***", text)
        return _API_KEY.sub("fs-***", text)


def _url_secrets(url: str) -> list[str]:
    out = []
    for part in url.split(","):  # NATS takes a list of servers
        try:
            split = urlsplit(part.strip())
        except ValueError:
            continue
        if split.password:
            out.append(split.password)
        if split.username and split.password is None:  # a token as the user
            out.append(split.username)
    return out


def short_name(name: str) -> str:
    """``fleetserve.gateway.app`` -> ``gateway``; ``transformers.modeling_utils`` ->
    ``transformers``; ``root`` -> ``fleetserve``."""
    if name == "root":
        return "fleetserve"
    if name.startswith("fleetserve."):
        name = name[len("fleetserve.") :]
    return name.split(".", 1)[0]


def clip(s: str, limit: int = FIELD_MAX) -> str:
    """``s`` cut to ``limit`` characters, with an ellipsis when it was longer."""
    return s if len(s) <= limit else s[: limit - 1] + "\u2026"


def _value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3g}"
    s = clip(str(v))
    if not s or any(c.isspace() or c in "\"'=" for c in s) or not s.isprintable():
        return json.dumps(s)
    return s


# a terminal's escape sequences (a library's bold or colour in its own message)
_ESCAPES = re.compile(r"\x1b\[[0-?]{0,16}[ -/]{0,4}[@-~]")


def message(record: logging.LogRecord) -> str:
    """The record's message without terminal escapes: a library that colours its
    own text (transformers' load report) leaves none in the log, text or JSON."""
    text = record.getMessage()
    return _ESCAPES.sub("", text) if "\x1b" in text else text


class TextFormatter(logging.Formatter):
    """``22:52:37 INFO  gateway: message key=value``."""

    def __init__(self, tag: str = "", redact: Redactor | None = None, color: bool = False):
        super().__init__()
        self.tag = tag
        self.redact = redact or Redactor()
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        level = _SHORT.get(record.levelname[0], record.levelname)
        shown = f"\x1b[{_COLORS.get(level, '0')}m{level:<5}\x1b[0m" if self.color else f"{level:<5}"
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        tag = f" {self.tag}" if self.tag else ""
        line = f"{when} {shown}{tag} {short_name(record.name)}: {message(record)}"
        extra = getattr(record, FIELDS, None) or {}
        line += "".join(f" {k}={_value(v)}" for k, v in extra.items() if v is not None)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return self.redact(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``msg``,
    ``tag`` when set, then the record's fields."""

    def __init__(self, tag: str = "", redact: Redactor | None = None):
        super().__init__()
        self.tag = tag
        self.redact = redact or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        ms = int(record.msecs)
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{ms:03d}Z"
        out: dict[str, object] = {
            "ts": ts,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": message(record),
        }
        if self.tag:
            out["tag"] = self.tag
        for k, v in (getattr(record, FIELDS, None) or {}).items():
            if k not in out and v is not None:
                out[k] = v if isinstance(v, (int, float, bool)) else clip(str(v))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        clean = {k: self.redact(v) if isinstance(v, str) else v for k, v in out.items()}
        return self.redact(json.dumps(clean, ensure_ascii=False))


class LineHandler(logging.Handler):
    """Writes each formatted record as one line to ``stream`` (default: the current
    ``sys.stderr``, looked up at each write so that rich's live displays can wrap it)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            out = self.stream or sys.stderr
            out.write(text + "\n")
            out.flush()
        except Exception:  # logging must never take the process down
            self.handleError(record)


def setup_logging(
    settings: Settings, *, tag: str = "", stream: TextIO | None = None
) -> logging.Handler:
    """Route every logger through one handler in the style ``settings`` asks for
    (``log_level``, ``log_format``); ``tag`` names the process (``worker-0``,
    ``cpu:1``) on each line. Calling it again replaces the handler it installed."""
    level = settings.log_level.strip().lower()
    if level not in LEVELS:
        raise ValueError(f"log_level must be one of {', '.join(LEVELS)}, not {level!r}")
    fmt = settings.log_format.strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"log_format must be text or json, not {fmt!r}")
    redact = Redactor.from_settings(settings)
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JsonFormatter(tag, redact)
    else:
        target = stream or sys.stderr
        formatter = TextFormatter(tag, redact, color=_is_tty(target))
    handler = LineHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(LibraryNoise())
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, LineHandler):
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _SERVERS:  # uvicorn's own loggers: no handlers of their own, to ours,
        lg = logging.getLogger(name)  # at our level (a uvicorn.Config in this process
        lg.handlers.clear()  # may have raised theirs: log_level="critical")
        lg.propagate = True
        lg.setLevel(logging.NOTSET)
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING if level != "debug" else logging.DEBUG)
    logging.captureWarnings(True)  # warnings.warn from libraries: logger "py.warnings"
    install_quieting()
    return handler


def _is_tty(stream: TextIO) -> bool:
    isatty: Callable[[], bool] | None = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):
        return False


__all__ = [
    "CHILD_ENV",
    "JsonFormatter",
    "LineHandler",
    "Redactor",
    "TextFormatter",
    "child_env",
    "clip",
    "kv",
    "setup_logging",
    "short_name",
]
