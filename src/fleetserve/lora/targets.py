"""An uploaded config's ``target_modules``, checked against the modules its weights hold.

PEFT reads ``target_modules`` as a list of module names (each one a whole name or its
last dotted parts) or, as a string, a regex that must match a module's whole name.
A regex from an upload never reaches Python's ``re`` (whose backtracking let one
pattern hold the GIL for seconds):

- a list of names is compared, never compiled; so are ``"all-linear"`` (PEFT's
  shorthand) and a string of plain name characters (``[A-Za-z0-9_.-]``, no regex
  syntax), matched as that literal name;
- any other string is a regex, accepted only when ``allow_regex`` (the uploading key
  has the admin scope: the registry says so from the caller's key) and compiled with
  RE2 (google-re2), whose matching is linear in the text, without backtracking, and
  releases the GIL. The pattern is at most :data:`MAX_PATTERN` characters and
  :data:`MAX_PROGRAM` RE2 instructions, each module name at most :data:`MAX_NAME`
  characters, and matching stops after :data:`MATCH_SECONDS` (one name takes well
  under 20 ms at these bounds; measured: 5 ms for a 1024-character name against a
  609-instruction NFA), so an upload's regex costs at most that much wall time of one
  thread, and none of the event loop's.

Module names from the weights are checked for length in every case, so no later step
(suffix matching against the base) works on a megabyte-long name. What gets served
is the resolved list of modules in the manifest; no pattern is kept or run again.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Iterable

from ..wire import Forbidden, InvalidInput

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
ALL_LINEAR = "all-linear"  # PEFT's shorthand: every Linear layer but the output head
MAX_NAME = 1024  # characters in one module name
MAX_PATTERN = 1000  # characters in a target_modules regex
MAX_PROGRAM = 2000  # RE2 program size (instructions) of that regex
MAX_REGEX_MEMORY = 8 << 20  # bytes RE2 may use for the compiled regex and its DFA
MATCH_SECONDS = 0.25  # wall time the regex may take over all the module names
_LITERAL = re.compile(r"[A-Za-z0-9_.\-]+")


def check_targets(targets: object, modules: Iterable[str], *, allow_regex: bool = False) -> None:
    """Each name in ``target_modules`` has tensors among ``modules`` (names with PEFT's
    prefix stripped); a regex string matches at least one. ``InvalidInput`` (400)
    naming the problem, or ``Forbidden`` (403) for a regex when not ``allow_regex``."""
    names = list(modules)
    for n in names:
        if len(n) > MAX_NAME:
            raise InvalidInput(
                f"{WEIGHTS}: module name {n[:60]!r}... is {len(n):,} characters, over the "
                f"limit of {MAX_NAME}",
                field="weights",
            )
    if targets is None or targets == ALL_LINEAR:
        return
    if isinstance(targets, str):
        if _LITERAL.fullmatch(targets):
            if targets not in names:
                raise InvalidInput(
                    f"{CONFIG}: target_modules {targets!r} is not a module in {WEIGHTS} "
                    "(a string must name a whole module; give a list to name last parts)",
                    field="config",
                )
            return
        if not allow_regex:
            raise Forbidden(
                f"{CONFIG}: target_modules {targets[:80]!r} is a regex; a regex is accepted "
                "only from a key with the admin scope: give target_modules as a list of "
                "module names",
                field="config",
            )
        _check_regex(targets, names)
        return
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise InvalidInput(f"{CONFIG}: target_modules must be a list of names", field="config")
    # a target names a module whole or by its last dotted parts: n == t, or n ends in
    # "." + t, that is reversed(n) starts with reversed(t) + "."; found by bisection
    exact = set(names)
    backwards = sorted(n[::-1] for n in names)
    for t in targets:
        if t in exact:
            continue
        key = t[::-1] + "."
        i = bisect.bisect_left(backwards, key)
        if i == len(backwards) or not backwards[i].startswith(key):
            raise InvalidInput(
                f"{CONFIG}: target module {t[:200]!r} has no tensors in {WEIGHTS}",
                field="config",
            )


def _check_regex(pattern: str, names: list[str]) -> None:
    import re2  # type: ignore[import-untyped]  # google-re2 ships no stubs

    if len(pattern) > MAX_PATTERN:
        raise InvalidInput(
            f"{CONFIG}: the target_modules regex is {len(pattern):,} characters, over the "
            f"limit of {MAX_PATTERN}",
            field="config",
        )
    options = re2.Options()
    options.max_mem = MAX_REGEX_MEMORY
    options.log_errors = False
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as exc:
        raise InvalidInput(
            f"{CONFIG}: target_modules is not a regex RE2 accepts (no backreferences or "
            f"lookarounds): {exc}",
            field="config",
        ) from None
    if compiled.programsize > MAX_PROGRAM:
        raise InvalidInput(
            f"{CONFIG}: the target_modules regex compiles to {compiled.programsize} "
            f"instructions, over the limit of {MAX_PROGRAM}: simplify it or list the names",
            field="config",
        )
    deadline = time.monotonic() + MATCH_SECONDS
    for n in names:
        if compiled.fullmatch(n) is not None:
            return
        if time.monotonic() > deadline:
            raise InvalidInput(
                f"{CONFIG}: the target_modules regex took over {MATCH_SECONDS} s to match "
                f"the module names of {WEIGHTS}: simplify it or list the names",
                field="config",
            )
    raise InvalidInput(
        f"{CONFIG}: target_modules {pattern[:200]!r} matches no module in {WEIGHTS}",
        field="config",
    )
