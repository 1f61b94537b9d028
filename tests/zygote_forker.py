"""For tests/cluster/test_zygote.py, run as ``python -m tests.zygote_forker FLAG``: a
process that has imported what its zygote preloads and runs one thread forks it
(``Zygote.forks``). Its children end as a fresh interpreter's would, and none runs
this process's exit handlers; where a second thread runs, or the environment or the
imports differ, the zygote is a fresh interpreter. Prints one line per finding."""

from __future__ import annotations

import atexit
import json  # noqa: F401  # the zygote's preload, imported here
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fleetserve.cluster.zygote import Zygote

CHILD = "tests.zygote_child"


def run(z: Zygote, *args: str) -> tuple[int, str]:
    r, w = os.pipe()
    try:
        child = z.spawn(CHILD, list(args), dict(os.environ), fds=(0, 1, w))
    finally:
        os.close(w)
    assert child is not None
    with os.fdopen(r) as err:
        said = err.read()
    return child.wait(30), said


def main(flag: Path) -> None:
    atexit.register(
        lambda: flag.write_text("the parent's", encoding="utf-8")
    )  # runs at our end only
    env = dict(os.environ)
    z = Zygote(env, preload=["json"])
    print("forks", z.forks())
    print("forks with an import missing", Zygote(env, preload=["json", "wave"]).forks())
    print("forks for another HF_HOME", Zygote({**env, "HF_HOME": "/x"}, preload=[]).forks())
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    print("forks beside a thread", z.forks())
    stop.set()
    t.join()
    deadline = time.monotonic() + 10  # joined, its task may linger a moment
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    z.start()
    assert z.proc is not None and not isinstance(z.proc, subprocess.Popen)
    print("zygote is our child", os.waitpid(z.proc.pid, os.WNOHANG) == (0, 0))
    print("exit", run(z, "exit", "3")[0])
    code, said = run(z, "raise", "boom")
    print("raise", code, said.strip().splitlines()[-1])
    code, said = run(z, "say", "a message")
    print("say", code, said.strip())
    print("atexit", run(z, "atexit", str(flag))[0], flag.read_text(encoding="utf-8"))
    flag.unlink()
    r, w = os.pipe()
    sleeper = z.spawn(CHILD, ["sleep"], env, fds=(0, w, 2))
    os.close(w)
    assert sleeper is not None
    with os.fdopen(r) as out:
        out.readline()
        sleeper.send_signal(signal.SIGINT)  # ignored by the zygote, not by its children
        print("sigint", sleeper.wait(30))
    print("parent's handler ran in a child", flag.exists())
    z.close()
    print("zygote ended", z.proc.returncode)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
