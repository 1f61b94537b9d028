"""A headless Chromium driven over the DevTools protocol, for tests that render pages.

No dependencies beyond ``websockets`` (installed with uvicorn[standard]): Chromium
starts with ``--remote-debugging-port=0``, writes the port it chose to
``DevToolsActivePort`` in its profile directory, and we speak CDP to one page over a
websocket. Waits are on conditions (:meth:`Browser.wait_for` evaluates an expression
in the page until it is truthy), never fixed sleeps.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--no-proxy-server",
    "--hide-scrollbars",
    "--mute-audio",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


class BrowserError(AssertionError):
    pass


class Browser:
    """One Chromium with one page. Use as a context manager."""

    def __init__(self, executable: str, *, width: int = 1280, height: int = 900) -> None:
        self.executable = executable
        self.size = (width, height)
        self.errors: list[str] = []  # uncaught exceptions, console errors, CSP violations
        self.network_errors: list[str] = []  # failed loads, HTTP errors (401, 404...)
        self._profile = Path(tempfile.mkdtemp(prefix="fleetserve-chromium-"))
        self._log = (self._profile / "chromium.log").open("wb")
        self._proc: subprocess.Popen[bytes] | None = None
        self._ws: ClientConnection | None = None
        self._stack = contextlib.ExitStack()
        self._session = ""
        self._next_id = 0

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Browser:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        profile = self._profile / "profile"
        args = [
            self.executable,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={self.size[0]},{self.size[1]}",
            "--remote-debugging-port=0",
            "about:blank",
        ]
        self._proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self._proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self._proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise BrowserError(f"chromium did not open its DevTools port: {self.log()}")
            time.sleep(0.05)  # polled: chromium tells its port only through this file
        port, path = port_file.read_text().splitlines()[:2]
        url = f"ws://127.0.0.1:{port}{path}"
        self._ws = self._stack.enter_context(connect(url, max_size=None, open_timeout=30))
        target = self.call("Target.createTarget", url="about:blank", session=False)["targetId"]
        attached = self.call("Target.attachToTarget", targetId=target, flatten=True, session=False)
        self._session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.set_viewport(*self.size)

    def close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):  # it may be gone already
                self.call("Browser.close", session=False, timeout=10)
            self._stack.close()
            self._ws = None
        if self._proc is not None:
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(15)
            self._proc = None
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def log(self) -> str:
        self._log.flush()
        return (self._profile / "chromium.log").read_text(errors="replace")[-3000:]

    # -- the protocol ---------------------------------------------------------------------
    def call(self, method: str, *, session: bool = True, timeout: float = 30, **params: Any) -> Any:
        assert self._ws is not None, "the browser is not running"
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self._session
        self._ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline - time.monotonic())
            if reply is None:
                raise BrowserError(f"no reply to {method} within {timeout} s")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _recv(self, timeout: float) -> dict[str, Any] | None:
        """The next message within ``timeout`` seconds (events are recorded on the way)."""
        assert self._ws is not None
        try:
            msg: dict[str, Any] = json.loads(self._ws.recv(timeout=max(0.0, timeout)))
        except TimeoutError:
            return None
        self._on_event(msg)
        return msg

    def _on_event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.errors.append(f"exception: {d.get('exception', {}).get('description') or d}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            self.errors.append(f"console.error: {args}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            text = f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}"
            (self.network_errors if entry.get("source") == "network" else self.errors).append(text)

    # -- the page -------------------------------------------------------------------------
    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def evaluate(self, expression: str) -> Any:
        out = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression!r} threw: {out['exceptionDetails']}")
        return out.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Evaluate ``expression`` until it is truthy; its value. Between tries, wait for
        the browser's next message (an event) for at most 50 ms."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText.slice(0, 1500) : ''")
                raise BrowserError(
                    f"timed out after {timeout} s waiting for {expression!r}; "
                    f"errors: {self.errors}; page text: {text!r}"
                )
            self._recv(min(0.05, max(0.0, deadline - time.monotonic())))

    def text(self, selector: str) -> str:
        return str(
            self.evaluate(f"document.querySelector({json.dumps(selector)})?.innerText ?? ''")
        )

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def set_viewport(self, width: int, height: int) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=width < 600,
        )

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(data)
        return data
