"""The public surface that clients and checks depend on: exports, CLI and HTTP routes."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import httpx
import pytest

import fleetserve
from fleetserve.cli import main

from .conftest import TINY, ServerThread

ALL = [
    "AdapterNotFound",
    "AsyncClient",
    "Client",
    "Conflict",
    "DeadlineExceeded",
    "FineTuningFailed",
    "FleetError",
    "Forbidden",
    "InternalError",
    "InvalidInput",
    "ModelNotFound",
    "Overloaded",
    "PayloadTooLarge",
    "Unauthorized",
    "Unavailable",
    "__version__",
]


def test_all_is_pinned() -> None:
    assert sorted(fleetserve.__all__) == ALL
    assert len(fleetserve.__all__) == len(set(fleetserve.__all__))
    for name in ALL:
        assert getattr(fleetserve, name) is not None
    for name in set(ALL) - {"AsyncClient", "Client", "__version__"}:
        assert issubclass(getattr(fleetserve, name), fleetserve.FleetError)


def test_version_matches_the_distribution() -> None:
    assert fleetserve.__version__ == importlib.metadata.version("fleetserve")


def test_console_script_points_at_cli_main() -> None:
    eps = importlib.metadata.entry_points(group="console_scripts", name="fleetserve")
    assert [ep.value for ep in eps] == ["fleetserve.cli:main"]


def test_help_lists_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("serve", "models", "bench", "gateway", "worker", "cluster", "dlq"):
        assert cmd in out


@pytest.mark.parametrize(
    ("cmd", "flags"),
    [
        ("serve", ("--host", "--port", "--models", "--catalog", "--api-key")),
        ("gateway", ("--host", "--port", "--catalog", "--api-key", "--nats")),
        ("worker", ("--host", "--models", "--catalog", "--nats", "--devices")),
        ("cluster", ("--host", "--port", "--models", "--catalog", "--api-key", "--nats")),
        ("models", ("--host", "--port", "--models", "--catalog", "--api-key")),
        ("dlq", ("--nats", "--queue-prefix")),
    ],
)
def test_subcommands_take_their_settings_flags(
    cmd: str, flags: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each subcommand takes the settings it uses (tests/test_cli_help.py: only those)."""
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = capsys.readouterr().out
    for flag in (*flags, "--config", "--log-level", "--log-format"):
        assert flag in out


def test_unknown_subcommand_fails() -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def test_python_dash_m_runs_the_cli() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fleetserve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "serve" in r.stdout and "models" in r.stdout and "bench" in r.stdout


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v1/models", "/metrics"])
def test_get_routes_exist(tiny_server: ServerThread, path: str) -> None:
    r = httpx.get(tiny_server.url + path)
    assert r.status_code == 200, r.text


def test_metrics_is_prometheus_text(tiny_server: ServerThread) -> None:
    r = httpx.get(tiny_server.url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    assert "# TYPE fleetserve_" in r.text


def test_models_lists_ids_with_slashes(tiny_server: ServerThread) -> None:
    body = httpx.get(tiny_server.url + "/v1/models").json()
    assert body["object"] == "list"
    assert TINY in [m["id"] for m in body["data"]] and "/" in TINY


def test_native_encode_route(tiny_server: ServerThread) -> None:
    r = httpx.post(f"{tiny_server.url}/v1/encode/{TINY}", json={"inputs": ["hello"]})
    assert r.status_code == 200 and len(r.json()["embeddings"][0]) == 32


def test_openai_embeddings_route(tiny_server: ServerThread) -> None:
    r = httpx.post(f"{tiny_server.url}/v1/embeddings", json={"model": TINY, "input": "hello"})
    assert r.status_code == 200
    assert r.json()["data"][0]["object"] == "embedding"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/v1/encode/{TINY}"),
        ("POST", "/healthz"),
        ("GET", "/v1/embeddings"),
        ("POST", "/v1/encode-nope"),
    ],
)
def test_wrong_method_or_path_is_404(tiny_server: ServerThread, method: str, path: str) -> None:
    r = httpx.request(method, tiny_server.url + path)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
