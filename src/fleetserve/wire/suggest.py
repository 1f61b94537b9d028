"""Did you mean: the known names closest to one that is not known, for error messages
(a model id, an adapter id). A name typed without its organisation (``all-MiniLM-L6-v2``
for ``sentence-transformers/all-MiniLM-L6-v2``) or in another case matches too."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

MAX = 3  # suggestions named at most


def close_names(name: str, known: Iterable[str]) -> list[str]:
    """Up to ``MAX`` of ``known`` that ``name`` likely meant, the likeliest first."""
    names = sorted(set(known))
    wanted = name.lower()
    exact = [k for k in names if k.lower() == wanted or k.lower().endswith("/" + wanted)]
    tail = wanted.rpartition("/")[2]
    prefix = [k for k in names if k.lower().startswith(wanted) or _tail(k).startswith(tail)]
    lowered = {k.lower(): k for k in names}
    fuzzy = difflib.get_close_matches(wanted, list(lowered), n=MAX, cutoff=0.6)
    tails = {_tail(k): k for k in names}
    by_tail = difflib.get_close_matches(tail, list(tails), n=MAX, cutoff=0.75)
    out: list[str] = []
    for k in [*exact, *prefix, *(lowered[f] for f in fuzzy), *(tails[t] for t in by_tail)]:
        if k not in out and k != name:
            out.append(k)
    return out[:MAX]


def _tail(name: str) -> str:
    return name.rpartition("/")[2].lower()


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'a' or 'b'?"``, or "" when nothing is close."""
    close = close_names(name, known)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    either = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
    return f"; did you mean {either}?"
