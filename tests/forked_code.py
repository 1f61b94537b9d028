"""``python -c CODE ARGS`` as a module, for the children tests/forked.py forks: runs
CODE with ``sys.argv`` as ``-c`` sets it (``["-c", *ARGS]``)."""

import sys

if __name__ == "__main__":
    code = sys.argv[1]
    sys.argv = ["-c", *sys.argv[2:]]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
