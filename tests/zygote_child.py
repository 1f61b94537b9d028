"""A child for tests/cluster/test_zygote.py, run as ``python -m tests.zygote_child``."""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    what, arg = argv[0], argv[1] if len(argv) > 1 else ""
    if what == "exit":
        return int(arg)
    if what == "sleep":
        print("sleeping", flush=True)
        time.sleep(60)
    if what == "show":  # what the child is: its environment, directory and session
        print(os.environ.get(arg, "-"), os.getcwd(), os.getsid(0) == os.getpid(), flush=True)
    if what == "rand":
        import torch

        print(torch.rand(1).item(), flush=True)
    if what == "atexit":
        atexit.register(lambda: Path(arg).write_text("ran", encoding="utf-8"))
    if what == "raise":
        raise RuntimeError(arg)
    if what == "say":  # the message as SystemExit's: on stderr, and exit 1
        sys.exit(arg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
