"""A bare HTTP server in its own process, for tests that read its RSS from /proc.

``python -m tests.http_limits_child '{"http_max_header_bytes": 4096}'`` serves, on a
loopback port it prints, ``GET /healthz`` and ``POST /echo`` (answers the body's
length; ``/late`` the same, a second late) through ``lifecycle.start_http`` with
Settings made of the JSON overrides, until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from fleetserve.lifecycle import shutdown, start_http
from fleetserve.settings import Settings


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["path"] == "/late":  # an app that takes a second before reading the body
        await asyncio.sleep(1.0)
    size = 0
    more = True
    while more:  # read the whole body (none for GET)
        event = await receive()
        if event["type"] == "http.disconnect":
            return
        size += len(event.get("body", b""))
        more = event.get("more_body", False)
    body = json.dumps({"path": scope["path"], "bytes": size}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def main(overrides: dict[str, Any]) -> None:
    settings = Settings(**overrides)
    server, task, port = await start_http(app, "127.0.0.1", 0, settings)
    print(port, flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the test closes our stdin
    await shutdown(server, [task])


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")))
