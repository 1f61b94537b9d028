from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleetserve.cli import main

from .conftest import TINY


def test_a_taken_port_is_a_clear_error_not_a_traceback(
    tiny_catalog: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc = main(
            [
                "serve",
                "--port",
                str(port),
                "--catalog",
                str(tiny_catalog),
                "--models",
                TINY,
                "--device",
                "cpu",
            ]
        )
    err = capsys.readouterr().err
    assert rc == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "Traceback" not in err


def test_bad_flag_value_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--port", "eighty"])
    assert info.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_bad_config_file_value_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "fleetserve.yaml"
    cfg.write_text("request_timeout: soon\n")
    assert main(["serve", "--config", str(cfg)]) == 2
    assert "request_timeout" in capsys.readouterr().err


async def test_a_crashed_worker_stage_fails_healthz(tiny_catalog: Path) -> None:
    import asyncio

    import httpx
    from rich.console import Console

    from fleetserve.server import EmbeddedServer

    from .conftest import tiny_settings

    server = EmbeddedServer(tiny_settings(tiny_catalog), console=Console(quiet=True))

    async def crash(*_: object) -> None:
        raise RuntimeError("a stage crashed")

    server.runners[TINY].run = crash  # type: ignore[method-assign, assignment]
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            for _ in range(200):  # the crash lands just after start
                if server.worker.failed is not None:
                    break
                await asyncio.sleep(0.01)
            health = await http.get("/healthz")
            assert health.status_code == 503
            assert health.json() == {"status": "failed"}
            assert (await http.get("/readyz")).status_code == 503
        assert server.failed_stage() is None  # the worker caught it: only /healthz says so
    finally:
        await server.stop()
