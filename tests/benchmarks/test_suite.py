"""``python -m benchmarks suite``: each process's CPU lands on the test its pytest process
ran then, servers and their children included; kernel threads and processes outside the
suite apart; a pid that came back is another process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.suite import main
from benchmarks.suite.attribute import OUTSIDE, Ran, Sessions, account, kind, phase_of
from benchmarks.suite.sampler import Proc, Sampler, Samples


def proc(pid: int, ppid: int, cmd: str, start: int = 100, name: str = "python") -> Proc:
    return Proc(f"{pid}:{start}", pid, ppid, start, cmd, name)


WORKER = "python -u -c import sys;exec(eval(sys.stdin.readline()))"  # an xdist worker


def test_cpu_goes_to_the_test_its_worker_ran_then() -> None:
    procs = [
        proc(10, 1, "python -m pytest -n 2"),  # the controller: runs no test
        proc(11, 10, WORKER),  # gw0
        proc(12, 11, "python -m fleetserve serve --port 0"),  # a server gw0's test started
        proc(13, 12, "python -m fleetserve.cluster.zygote_main 3"),  # its child
        proc(20, 1, "python -m pytest -m soaks"),  # another phase, running its own tests
        proc(30, 2, "", name="kdamond.0"),  # a kernel thread
        proc(40, 1, "pip install x"),  # not the suite's
        proc(12, 1, "nats-server -p 0", start=900),  # pid 12 again, later: not gw0's
    ]
    sessions = Sessions(
        phase={10: "-n 2", 11: "", 20: "-m soaks"},
        worker={10: "", 11: "gw0", 20: ""},
        tests={
            11: [Ran("tests/a.py::one", 11, 0.0, 10.0), Ran("tests/b.py::two", 11, 10.0, 20.0)],
            20: [Ran("tests/c.py::soak", 20, 0.0, 30.0)],
        },
    )
    ticks = [
        (5.0, {"12:100": 2.0, "11:100": 1.0, "20:100": 0.5}),
        (15.0, {"13:100": 3.0, "30:100": 4.0, "40:100": 5.0}),
        (25.0, {"11:100": 0.25, "12:900": 6.0}),  # gw0 between tests; the new pid 12
    ]
    a = account(Samples({p.key: p for p in procs}, ticks), sessions)
    assert a.seen == pytest.approx(21.75)
    assert a.by_test == {
        "tests/a.py::one": 3.0,
        "tests/b.py::two": 3.0,
        f"{OUTSIDE} -n 2": 0.25,
        "tests/c.py::soak": 0.5,
    }
    assert a.by_file["tests/a.py"] == 3.0 and a.by_file["tests/b.py"] == 3.0
    assert a.by_phase == {"-n 2": 6.25, "-m soaks": 0.5}  # gw0's phase is its controller's
    assert a.kernel == {"kdamond.0": 4.0}
    assert a.outside == {"pip": 5.0, "nats-server": 6.0}
    assert a.by_kind["fleetserve serve"] == 2.0 and a.by_kind["fleetserve (zygote)"] == 3.0
    assert kind(procs[1]) == "pytest worker" and kind(procs[5]) == "kdamond.0"
    assert kind(procs[0]) == "pytest" and kind(procs[6]) == "pip"


def test_a_pytest_run_is_named_by_its_marker_expression() -> None:
    parallel = ["-n", "3", "--dist", "loadfile", "-m", "not tunes and not soaks", "-q"]
    assert phase_of(parallel) == "-m not tunes and not soaks"
    assert phase_of(["-n", "2", "-m", "tunes"]) == "-m tunes"
    assert phase_of(["-q", "tests/x.py", "-m"]) == "-q tests/x.py" and phase_of([]) == ""


def test_a_pytest_that_a_test_starts_is_that_test_s() -> None:
    procs = [proc(10, 1, "python -m pytest"), proc(11, 10, "python -m pytest -q inner")]
    sessions = Sessions(
        phase={10: "", 11: "-q inner"},
        worker={10: "", 11: ""},
        tests={
            10: [Ran("tests/t.py::outer", 10, 0.0, 10.0)],
            11: [Ran("inner.py::x", 11, 1.0, 2.0)],
        },
    )
    a = account(Samples({p.key: p for p in procs}, [(1.5, {"11:100": 1.0})]), sessions)
    assert a.by_test == {"tests/t.py::outer": 1.0} and a.by_phase == {"": 1.0}


BURN = """
import sys, time
t = time.process_time()
while time.process_time() - t < 0.4:
    pass
print(time.process_time(), flush=True)
sys.stdin.read()
"""


def test_the_sampler_sees_a_child_s_cpu_from_its_birth() -> None:
    sampler = Sampler(tick=0.05)
    sampler.start()
    with subprocess.Popen(
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        used = float(child.stdout.readline())  # its own count, after the burn
        deadline = time.monotonic() + 10
        key = None
        while time.monotonic() < deadline:  # until a tick after the burn has read it
            procs = list(sampler.samples.procs.items())
            key = next((k for k, p in procs if p.pid == child.pid), key)
            seen = sum(d.get(key, 0.0) for _, d in list(sampler.samples.ticks)) if key else 0.0
            if seen >= used - 0.02:
                break
            time.sleep(0.05)
        child.stdin.close()
        child.wait(timeout=10)
    samples = sampler.stop()
    assert key is not None and samples.procs[key].cmd.startswith(sys.executable)
    seen = sum(d.get(key, 0.0) for _, d in samples.ticks)
    assert used - 0.02 <= seen <= used + 0.1, (seen, used)


TINY = """
import time

def test_a():
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass

def test_b():
    pass
"""


@pytest.mark.slow  # a pytest of its own under the sampler
def test_the_bench_reports_a_pytest_run(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_tiny.py").write_text(TINY)
    out = tmp_path / "report"
    t = str(tmp_path / "t")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--rootdir", t, "-c", "/dev/null", t]  # fmt: skip
    assert main(["--out", str(out), "--tick", "0.05", "--", *command]) == 0
    r = json.loads((out / "suite-cpu.json").read_text())
    tests = dict(r["account"]["by_test"])
    assert tests["test_tiny.py::test_a"] >= 0.2, tests  # (node ids from its rootdir)
    assert r["run"]["rc"] == 0 and r["run"]["cpu_s"] >= 0.3 and r["machine"]["class"]
    md = (out / "suite-cpu.md").read_text()
    assert "test_tiny.py::test_a" in md and (out / "suite-cpu.png").stat().st_size > 0
