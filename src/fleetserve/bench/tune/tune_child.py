"""One phase of a background tune: ``fleetserve tune`` as a child process.

It runs in a session of its own (a Ctrl-C at the server's terminal does not reach
it), writes its output to ``<tune-dir>/.<model>.log``, is paused through the pause
ledger, and is stopped with SIGTERM (its run then says ``cancelled`` and nothing is
written), then SIGKILL after ``STOP_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from ...cluster.natsd import die_with_parent
from ...logs import child_env
from ...settings import ENV_PREFIX, Settings
from .pauses import Ledger
from .runs import RunStore, now_iso

LOOK_S = 0.5  # how often the caller's reasons to stop are looked at
STOP_S = 5.0  # a child's grace after SIGTERM before it is killed
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


NOT_FOR_TUNES = ("api_key", "keys", "keys_file", "nats")  # the server's, not the tune's


def tune_env(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: ``base`` without its ``FLEETSERVE_*`` (the server's
    settings, however it got them, replace them), then those settings, less the
    secrets a tune does not need (API keys, the broker's URL)."""
    env = {k: v for k, v in base.items() if not k.startswith(ENV_PREFIX)}
    drop = {Settings.env_name(n) for n in NOT_FOR_TUNES}
    env.update({k: v for k, v in settings.to_env().items() if k not in drop})
    return child_env(env)


class TuneChild:
    def __init__(
        self, env: Mapping[str, str], profile_dir: Path, tune_dir: Path, ledger: Ledger
    ) -> None:
        self.env, self.profile_dir, self.tune_dir, self.ledger = env, profile_dir, tune_dir, ledger
        self.proc: asyncio.subprocess.Process | None = None
        self.run_id = ""  # the run document it writes, where the server named it

    def args(
        self, model: str, budget: float, quick: bool, start: str = "", run_id: str = ""
    ) -> list[str]:
        args = [sys.executable, "-m", "fleetserve", "tune", model, "--budget", f"{budget:g}",
                "--max-processes", "1", "--output", str(self.profile_dir),
                "--report-dir", str(self.tune_dir / "reports"),
                "--pause-file", str(self.ledger.path)]  # fmt: skip
        if quick:  # (its windows follow its budget, as every search's: options.windows)
            args.append("--quick")
        args += ["--run-id", run_id] if run_id else []
        return args + (["--start", start] if start else [])

    async def run(
        self,
        model: str,
        budget: float,
        quick: bool,
        stop_why: Callable[[], str | None],
        start: str = "",
        run_id: str = "",
    ) -> tuple[int | None, str]:
        """(exit code, its last error line); (None, why) when ``stop_why`` gave a reason
        to stop it. Cancelled, it stops the child before it ends."""
        log_file = self.tune_dir / f".{model.replace('/', '--')}.log"
        self.run_id = run_id
        with log_file.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args(model, budget, quick, start, run_id), stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=out, env=self.env, start_new_session=True,
                preexec_fn=die_with_parent,  # a killed server leaves no tune behind
            )  # fmt: skip
        self.ledger.attach(self.proc.pid)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    rc = await asyncio.wait_for(self.proc.wait(), LOOK_S)
                    return rc, last_error(log_file)
                why = stop_why()
                if why is not None:
                    await self.stop()
                    return None, why
        except BaseException:  # the server stops (cancelled), or this broke: it goes too
            await self.stop()
            raise
        finally:
            self.ledger.attach(None)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    def rss(self) -> int:
        """The child's resident memory now, in bytes (0 once it ended or if unknown).
        The background tune runs one process (``--max-processes 1``), so its own."""
        pid = self.pid
        if pid is None:
            return 0
        try:
            resident = int(Path(f"/proc/{pid}/statm").read_text(encoding="utf-8").split()[1])
        except (OSError, ValueError, IndexError):
            return 0
        return resident * PAGE

    async def stop(self) -> None:
        """SIGTERM (the tune ends as Ctrl-C would: nothing written), then SIGKILL."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        self.ledger.attach(None)  # traffic meanwhile must not stop it again
        for sig in (signal.SIGCONT, signal.SIGTERM):  # a stopped child cannot end
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)  # its own children (a compile's workers) too
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), STOP_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            self._killed()

    def _killed(self) -> None:
        """A child killed before it wrote its end (a tune at nice 10 on busy cores may
        not, within ``STOP_S``) would leave its run ``running`` for good: it says
        cancelled."""
        if not self.run_id:
            return
        store = RunStore(self.tune_dir)
        try:
            run = store.get(self.run_id)
        except KeyError:
            return
        if run.get("status") == "running":
            why = f"cancelled (killed: it did not stop within {STOP_S:g}s)"
            run.update(status="cancelled", error=why, finished_at=now_iso())
            store.write(run)


def last_error(log_file: Path) -> str:
    """The child's ``error:`` line, if it printed one."""
    try:
        lines = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    errors = [ln.strip() for ln in lines if "error:" in ln]
    return (errors or [""])[-1][:300]


__all__ = ["TuneChild", "last_error", "tune_env"]
