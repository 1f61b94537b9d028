"""Whose CPU it was: each process's gains put on the test its pytest process ran then.

A process belongs to the nearest pytest process above it (an xdist worker, or a pytest
that runs its tests itself), found through the parents recorded when each process was
first seen (a pid that came back is told apart by its start time). A gain belongs to
the test that process was running at that moment (a server a module started serves
the module's tests in turn), or to ``<outside tests>`` (collection, start-up, what runs
on between tests). The phase is the pytest run the process belongs to, named by its
marker expression (``-m soaks``), else its first arguments. Kernel threads and whatever
runs outside the suite's pytest runs (the install, the machine's own) are counted apart.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .sampler import Proc, Samples

OUTSIDE = "<outside tests>"


@dataclass(frozen=True)
class Ran:
    nodeid: str
    pid: int
    t0: float
    t1: float


def phase_of(argv: list[str]) -> str:
    """A pytest run's name: its marker expression (``-m tunes``), else its first arguments."""
    if "-m" in argv[:-1]:
        return f"-m {argv[argv.index('-m') + 1]}"
    return " ".join(argv[:2])


@dataclass
class Sessions:
    """What the pytest plugin wrote: each session's process and phase, and the tests."""

    phase: dict[int, str] = field(default_factory=dict)  # pid -> its pytest's arguments
    worker: dict[int, str] = field(default_factory=dict)  # pid -> xdist worker id, or ""
    tests: dict[int, list[Ran]] = field(default_factory=dict)  # pid -> by start

    @classmethod
    def read(cls, folder: Path) -> Sessions:
        s = cls()
        for file in sorted(folder.glob("*.jsonl")):
            for line in file.read_text(encoding="utf-8").splitlines():
                r: dict[str, Any] = json.loads(line)
                if "session" in r and r.get("event") == "start":
                    s.worker[r["session"]] = r["worker"]
                    s.phase[r["session"]] = phase_of(r["argv"])
                elif "test" in r:
                    s.tests.setdefault(r["pid"], []).append(
                        Ran(r["test"], r["pid"], r["t0"], r["t1"])
                    )
        for tests in s.tests.values():
            tests.sort(key=lambda t: t.t0)
        return s


@dataclass
class Account:
    seen: float = 0.0  # CPU-seconds sampled in all
    by_phase: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_file: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_test: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_kind: defaultdict[str, float] = field(
        default_factory=lambda: defaultdict(float)
    )  # what ran: nats-server, ...
    kernel: defaultdict[str, float] = field(
        default_factory=lambda: defaultdict(float)
    )  # kernel threads, by name
    outside: defaultdict[str, float] = field(
        default_factory=lambda: defaultdict(float)
    )  # not the suite's, by kind

    def as_dict(self) -> dict[str, Any]:
        def rows(c: defaultdict[str, float]) -> list[tuple[str, float]]:
            return [(k, round(v, 1)) for k, v in sorted(c.items(), key=lambda kv: -kv[1])]

        return {"seen_cpu_s": round(self.seen, 1), "by_phase": rows(self.by_phase),
                "by_file": rows(self.by_file), "by_test": rows(self.by_test),
                "by_kind": rows(self.by_kind), "kernel": rows(self.kernel),
                "outside": rows(self.outside)}  # fmt: skip


KINDS = (  # the first that the command line holds names the kind
    ("nats-server", "nats-server"), ("chromium", "chromium"),
    ("exec(eval(sys.stdin", "pytest worker"),  # (execnet's command line)
    ("-m pytest", "pytest"), ("forkserver", "fork server"),
    ("zygote", "fleetserve (zygote)"), (" gateway", "fleetserve gateway"),
    (" worker", "fleetserve worker"), (" serve", "fleetserve serve"),
    (" tune", "fleetserve tune"), ("fleetserve", "fleetserve (other)"),
    ("pip", "pip"), ("python", "python (other)"),
)  # fmt: skip


def kind(p: Proc) -> str:
    if not p.cmd:
        return p.name
    return next((k for pat, k in KINDS if pat in p.cmd), p.cmd.split(" ")[0].rsplit("/", 1)[-1])


class Tree:
    """Parents by pid and start time: a pid's parent is the process of that pid that was
    started last before it."""

    def __init__(self, procs: dict[str, Proc]) -> None:
        self.procs = procs
        self._by_pid: dict[int, list[tuple[int, str]]] = {}
        for p in procs.values():
            self._by_pid.setdefault(p.pid, []).append((p.start, p.key))
        for v in self._by_pid.values():
            v.sort()
        self._owner: dict[str, int | None] = {}

    def latest(self, pid: int) -> Proc | None:
        found = self._by_pid.get(pid)
        return self.procs[found[-1][1]] if found else None

    def parent(self, p: Proc | None) -> Proc | None:
        if p is None:
            return None
        older = [k for start, k in self._by_pid.get(p.ppid, []) if start <= p.start]
        return self.procs[older[-1]] if older else None

    def owner(self, p: Proc, pytest_pids: set[int]) -> int | None:
        """The pid of the nearest pytest process at or above ``p``, if any."""
        if p.key not in self._owner:
            q: Proc | None = p
            while q is not None and q.pid not in pytest_pids:
                q = self.parent(q)
            self._owner[p.key] = q.pid if q is not None else None
        return self._owner[p.key]


def _running(tests: list[Ran], starts: list[float], t: float) -> str:
    i = bisect.bisect_right(starts, t) - 1
    return tests[i].nodeid if i >= 0 and t <= tests[i].t1 else OUTSIDE


def _nested(tree: Tree, sessions: Sessions) -> set[int]:
    """The pytest runs a test started (below a process that ran tests): their CPU is that
    test's, not a phase of its own."""
    ran = set(sessions.tests)
    out = set()
    for pid in sessions.phase:
        up = tree.parent(tree.latest(pid))
        while up is not None:
            if up.pid in ran:
                out.add(pid)
                break
            up = tree.parent(up)
    return out


def account(samples: Samples, sessions: Sessions) -> Account:
    tree, a = Tree(samples.procs), Account()
    pytest_pids = set(sessions.phase) - _nested(tree, sessions)
    starts = {pid: [t.t0 for t in ts] for pid, ts in sessions.tests.items()}
    phases: dict[int, str] = {}
    for t, gained in samples.ticks:
        for key, cpu in gained.items():
            p = samples.procs[key]
            a.seen += cpu
            if p.kernel:
                a.kernel[p.name] += cpu
                continue
            owner = tree.owner(p, pytest_pids)
            if owner is None:
                a.outside[kind(p)] += cpu
                continue
            a.by_kind[kind(p)] += cpu
            if owner not in phases:
                phases[owner] = _phase(tree, sessions, owner)
            phase = phases[owner]
            a.by_phase[phase] += cpu
            test = _running(sessions.tests.get(owner, []), starts.get(owner, []), t)
            label = test if test != OUTSIDE else f"{OUTSIDE} {phase}"
            a.by_test[label] += cpu
            a.by_file[label.split("::")[0]] += cpu
    return a


def _phase(tree: Tree, sessions: Sessions, pid: int) -> str:
    """An xdist worker's phase is its controller's: the pytest process above it."""
    if not sessions.worker.get(pid):
        return sessions.phase[pid]
    up = tree.parent(tree.latest(pid))
    while up is not None and up.pid not in sessions.phase:
        up = tree.parent(up)
    return sessions.phase[up.pid] if up is not None else sessions.phase[pid]
