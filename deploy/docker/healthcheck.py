"""Container health check: GET a health path of the fleetserve process in this container.

Used by the images' HEALTHCHECK (``python /opt/fleetserve/healthcheck.py /healthz``),
with nothing but the standard library (slim images carry no curl). ``serve`` and
``gateway`` answer on ``FLEETSERVE_PORT``, a worker on ``FLEETSERVE_WORKER_PORT``: the
first port that answers decides. Exit 0 on HTTP 200, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def check(path: str, ports: list[str], timeout: float = 2.0) -> int:
    for port in ports:
        url = f"http://127.0.0.1:{port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return 0 if resp.status == 200 else 1
        except urllib.error.HTTPError:  # it answered, but not 200 (503: not alive/ready)
            return 1
        except OSError:  # nothing listens there: try the next port
            continue
    return 1


if __name__ == "__main__":
    wanted = sys.argv[1] if len(sys.argv) > 1 else "/healthz"
    env = os.environ
    candidates = [env.get("FLEETSERVE_PORT", "8080"), env.get("FLEETSERVE_WORKER_PORT", "8081")]
    sys.exit(check(wanted, [p for p in candidates if p and p != "0"]))
