"""The README's examples run, against a real server with the real bundled model."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from .conftest import ServerThread

README = Path(__file__).resolve().parents[1] / "README.md"
DEFAULT_URL = "http://127.0.0.1:8080"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def test_readme_opens_with_the_two_commands() -> None:
    first = blocks("bash")[0]
    assert "make serve" in first and "make test" in first


@pytest.mark.slow
def test_curl_example(real_server: ServerThread) -> None:
    (cmd,) = [b for b in blocks("bash") if b.lstrip().startswith("curl")]
    out = subprocess.run(
        ["bash", "-c", cmd.replace(DEFAULT_URL, real_server.url)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    body = json.loads(out)
    assert len(body["embeddings"]) == 2 and len(body["embeddings"][0]) == 128


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1])
def test_python_examples(real_server: ServerThread, index: int) -> None:
    code = blocks("python")[index].replace(DEFAULT_URL, real_server.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"README.md python block {index}", "exec"), {})
    printed = out.getvalue()
    assert ("384 " in printed) if index == 0 else ("(2, 384) float16" in printed)


@pytest.mark.slow
def test_families_example(fleet_server: ServerThread) -> None:
    code = blocks("python")[2].replace(DEFAULT_URL, fleet_server.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md python block 2", "exec"), {})
    assert out.getvalue().splitlines() == ["1 8 sports", "['color', 'fruit']"]


@pytest.mark.slow
def test_the_hardware_command_runs_as_shown() -> None:
    (block,) = [b for b in blocks("bash") if "fleetserve hardware" in b]
    cmd = block.splitlines()[0].split("#", 1)[0].strip()
    assert cmd == ".venv/bin/fleetserve hardware"
    exe, sub = cmd.split()
    out = subprocess.run(
        [str(README.parent / exe), sub, "--profile-dir", "/dev/null/none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "hardware class: " in out.stdout and "fallback chain" in out.stdout
    assert (
        "tune" in block and "--tune quick" in block
    )  # the other two lines: tested in tests/bench/tune


MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.slow
def test_the_fleet_examples_run_as_shown(real_server: ServerThread) -> None:
    (block,) = [b for b in blocks("bash") if "--memory-budget" in b]
    lines = [ln.split("#", 1)[0].strip() for ln in block.replace("\\\n", "").splitlines()]
    serve, models, curl = (ln for ln in lines if ln)
    budget = serve.split("--memory-budget", 1)[1].split()[0]
    from fleetserve.fleet.memory import parse_size

    assert parse_size(budget, limit=1 << 40) == 2 << 30
    port = real_server.url.rsplit(":", 1)[1]
    exe, sub = models.split()
    out = subprocess.run(
        [str(README.parent / exe), sub, "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # piped: tab-separated columns
    row = next(ln.split("\t") for ln in out.stdout.splitlines() if ln.startswith(MINILM + "\t"))
    assert row[2] == "resident" and row[3].endswith("MiB") and row[4] == "yes", out.stdout
    cmd = shlex.split(curl.replace("localhost:8080", real_server.url).replace(">/dev/null", ""))
    cmd.insert(1, "-w%{http_code}")
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert got.stdout.endswith("200"), (cmd, got.stdout, got.stderr)


@pytest.fixture(scope="module")
def legal_lora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's ./legal-lora: a rank-16 PEFT LoRA on the bundled MiniLM."""
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve

    from .conftest import REAL
    from .tiny_lora import make_lora

    root = tmp_path_factory.mktemp("readme-lora")
    base = resolve(REAL, Catalog.load().get(REAL).sources, root / "hub")
    return make_lora(base, root / "legal-lora", rank=16, alpha=32, scale=0.02, base_name=REAL)


@pytest.mark.slow
def test_the_lora_python_example(real_server: ServerThread, legal_lora: Path) -> None:
    (code,) = [b for b in blocks("python") if "upload_adapter" in b]
    code = code.replace(DEFAULT_URL, real_server.url).replace("./legal-lora", str(legal_lora))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md lora block", "exec"), {})
    assert out.getvalue().splitlines() == ["default/legal (1, 384)", "384"]


@pytest.mark.slow
def test_the_lora_commands_run_as_shown(real_server: ServerThread, legal_lora: Path) -> None:
    (block,) = [b for b in blocks("bash") if "lora add" in b]
    lines = [ln.split("#", 1)[0].strip() for ln in block.replace("\\\n", "").splitlines()]
    add, ls, curl = (ln for ln in lines if ln)
    port = real_server.url.rsplit(":", 1)[1]
    for cmd in (add.replace("./legal-lora", str(legal_lora)), ls):
        argv = shlex.split(cmd)
        out = subprocess.run(
            [str(README.parent / argv[0]), *argv[1:], "--port", port],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "default/legal@" in out.stdout, out.stdout
    cmd = shlex.split(curl.replace("localhost:8080", real_server.url))
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert len(json.loads(got.stdout)["data"][0]["embedding"]) == 384, got.stdout


@pytest.mark.slow
def test_the_fine_tuning_example(real_server: ServerThread, tmp_path: Path) -> None:
    (code,) = [b for b in blocks("python") if "fine_tune(" in b]
    code = code.replace(DEFAULT_URL, real_server.url).replace(
        '"faq.jsonl"', repr(str(tmp_path / "faq.jsonl"))
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md fine-tuning block", "exec"), {})
    status, better, name = out.getvalue().split()
    assert (status, better) == ("succeeded", "True"), out.getvalue()
    # the next version of default/faq: a store kept from an earlier run holds others
    assert re.fullmatch(r"sentence-transformers/all-MiniLM-L6-v2:default/faq@\d+", name)


def test_the_fine_tuning_command_is_the_cli() -> None:
    (block,) = [b for b in blocks("bash") if "lora train" in b]
    from fleetserve.cli import _parser

    argv = shlex.split(block.split("#", 1)[0].replace("\\\n", " "))[1:]
    args = _parser().parse_args(argv)
    assert (args.lora_action, args.lora_model) == (
        "train",
        "sentence-transformers/all-MiniLM-L6-v2",
    )


def test_the_operations_commands_are_real() -> None:
    """The Operations block: the chart and values files it names exist, the capacity
    command prints a pool's values as shown, and the serve line parses (both run from
    the venv, as every command of the README)."""
    import sys

    import yaml

    from fleetserve.cli import _parser

    (block,) = [b for b in blocks("bash") if "helm install" in b]
    lines = [ln.split("#", 1)[0].strip() for ln in block.replace("\\\n", " ").splitlines()]
    helm_lines = [shlex.split(ln) for ln in lines if ln.startswith("helm")]
    for argv in helm_lines:
        paths = [a for a in argv if a.startswith("deploy/")]
        assert paths and all((README.parent / a).exists() for a in paths), argv
    (capacity,) = [shlex.split(ln) for ln in lines if ln.startswith(".venv/bin/python")]
    out = subprocess.run(
        [sys.executable, *capacity[1:]], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    (pool,) = yaml.safe_load(out)["workerPools"]
    assert pool["pinned"] == ["sentence-transformers/all-MiniLM-L6-v2"]
    assert pool["scaling"]["lagThresholds"]["sentence-transformers/all-MiniLM-L6-v2"]["batch"] > 0
    (serve,) = [shlex.split(ln) for ln in lines if ln.startswith(".venv/bin/fleetserve")]
    args = _parser().parse_args(serve[1:])
    assert (args.command, args.log_format, args.tracing) == ("serve", "json", True)


def test_the_add_commands_parse_as_shown() -> None:
    """The "Any model in one command" block: each line is the CLI's (the command itself
    runs in tests/test_cli_add.py)."""
    from fleetserve.cli import _parser

    (block,) = [b for b in blocks("bash") if "fleetserve add" in b]
    lines = [ln.split("#", 1)[0].strip() for ln in block.splitlines() if ln.strip()]
    add, serve = (_parser().parse_args(shlex.split(ln)[1:]) for ln in lines)
    assert (add.command, add.add_source, add.catalog) == ("add", "~/models/my-embedder", "~/models")
    assert (serve.command, serve.catalog) == ("serve", "~/models")
