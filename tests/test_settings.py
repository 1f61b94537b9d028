"""Settings: one frozen typed object, layered defaults < file < env < CLI < overrides."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest
import yaml

import fleetserve
from fleetserve.settings import ENV_PREFIX, Settings

SRC = Path(fleetserve.__file__).parent


def test_defaults() -> None:
    s = Settings.load()
    assert s == Settings()
    assert (s.host, s.port) == ("127.0.0.1", 8080)
    assert s.models == "" and s.model_list() == []
    assert s.catalog == "" and s.api_key == "" and s.config == ""
    assert s.request_timeout == 30.0 and s.max_queue_depth == 1024
    assert s.max_body_bytes == 16 * 1024 * 1024


def test_model_list_splits_and_strips() -> None:
    s = Settings.load(overrides={"models": " a/b , c,,  "})
    assert s.model_list() == ["a/b", "c"]


def _config(tmp_path: Path, data: dict[str, object]) -> Path:
    f = tmp_path / "fleetserve.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_layering_file_env_cli_overrides(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        {
            "host": "file-host",
            "port": 1001,
            "models": "file-model",
            "log_level": "debug",
            "device": "file-device",
        },
    )
    env = {
        "FLEETSERVE_CONFIG": str(cfg),
        "FLEETSERVE_PORT": "1002",
        "FLEETSERVE_MODELS": "env-model",
        "FLEETSERVE_DEVICE": "env-device",
    }
    cli = {"port": 1003, "device": "cli-device", "host": None}
    s = Settings.load(env=env, cli=cli, overrides={"device": "override-device"})
    assert s.log_level == "debug"  # file only
    assert s.host == "file-host"  # CLI None does not hide the file
    assert s.models == "env-model"  # env beats file
    assert s.port == 1003  # CLI beats env
    assert s.device == "override-device"  # overrides beat everything
    assert s.request_timeout == 30.0  # untouched default


def test_config_path_from_cli_beats_env(tmp_path: Path) -> None:
    a = _config(tmp_path, {"port": 1})
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump({"port": 2}))
    s = Settings.load(env={"FLEETSERVE_CONFIG": str(a)}, cli={"config": str(b)})
    assert s.port == 2 and s.config == str(b)


def test_config_file_accepts_dashed_keys(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"request-timeout": 2.5, "max-queue-depth": "7"})
    s = Settings.load(cli={"config": str(cfg)})
    assert s.request_timeout == 2.5 and s.max_queue_depth == 7


def test_config_file_must_be_a_mapping(tmp_path: Path) -> None:
    f = tmp_path / "list.yaml"
    f.write_text("- port\n- 1\n")
    with pytest.raises(ValueError, match="mapping"):
        Settings.load(cli={"config": str(f)})


def test_env_values_are_coerced_to_the_field_type() -> None:
    s = Settings.load(
        env={
            "FLEETSERVE_PORT": "9000",
            "FLEETSERVE_REQUEST_TIMEOUT": "2.5",
            "FLEETSERVE_MAX_BATCH_TOKENS": "512",
        }
    )
    assert s.port == 9000 and type(s.port) is int
    assert s.request_timeout == 2.5 and type(s.request_timeout) is float
    assert s.max_batch_tokens == 512
    assert type(Settings.load(overrides={"retry_after": 3}).retry_after) is float


def test_env_without_the_prefix_is_ignored() -> None:
    assert Settings.load(env={"PORT": "1", "port": "2"}).port == 8080


@pytest.mark.parametrize(
    ("layer", "name", "value"),
    [
        ("env", "port", "eighty"),
        ("env", "request_timeout", "soon"),
        ("cli", "max_queue_depth", "many"),
        ("overrides", "max_body_bytes", "1.5"),
        ("overrides", "port", [1]),
    ],
)
def test_bad_value_names_the_setting(layer: str, name: str, value: object) -> None:
    key = Settings.env_name(name) if layer == "env" else name
    kwargs: dict[str, dict[str, object]] = {layer: {key: value}}
    with pytest.raises(ValueError, match=f"setting {name}"):
        Settings.load(**kwargs)  # type: ignore[arg-type]


def test_unknown_keys_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nope"):
        Settings.load(overrides={"nope": 1})
    with pytest.raises(ValueError, match="prot"):
        Settings.load(cli={"prot": 1})
    cfg = _config(tmp_path, {"port": 1, "workers": 4})
    with pytest.raises(ValueError, match="workers"):
        Settings.load(cli={"config": str(cfg)})


def test_repr_redacts_the_api_key() -> None:
    s = Settings.load(overrides={"api_key": "s3cr3t-token", "host": "0.0.0.0"})
    assert s.api_key == "s3cr3t-token"
    for text in (repr(s), str(s), f"{s}"):
        assert "s3cr3t-token" not in text
        assert "api_key='***'" in text and "host='0.0.0.0'" in text
    assert "api_key=''" in repr(Settings())


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]
    assert hash(s) == hash(Settings())


def test_add_arguments_creates_one_flag_per_field() -> None:
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    ns = parser.parse_args([])
    names = [f.name for f in dataclasses.fields(Settings)]
    assert all(getattr(ns, n) is None for n in names)  # unset flags let lower layers show
    ns = parser.parse_args(
        [
            "--port",
            "5",
            "--max-queue-depth",
            "3",
            "--request-timeout",
            "0.5",
            "--api-key",
            "k",
            "--hardware-class",
            "cpu",
        ]
    )
    assert ns.port == 5 and ns.max_queue_depth == 3 and ns.request_timeout == 0.5
    s = Settings.load(env={"FLEETSERVE_PORT": "7", "FLEETSERVE_HOST": "h"}, cli=vars(ns))
    assert (s.port, s.host, s.api_key, s.hardware_class) == (5, "h", "k", "cpu")
    with pytest.raises(SystemExit):
        parser.parse_args(["--port", "x"])


def test_help_mentions_env() -> None:
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    text = parser.format_help()
    assert "--max-body-bytes" in text and "FLEETSERVE_MAX_BODY_BYTES" in text


def test_describe_lists_every_field() -> None:
    rows = Settings.describe()
    names = [f.name for f in dataclasses.fields(Settings)]
    assert [r[0] for r in rows] == names
    for name, env, flag, help_text in rows:
        assert env == ENV_PREFIX + name.upper()
        assert flag == "--" + name.replace("_", "-")
        assert help_text.strip()


ENV_NAMES = ("environ", "getenv", "environb", "getenvb")


def _is_os_attr(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ENV_NAMES
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _reads_environment(tree: ast.AST) -> list[int]:
    """Lines that read the environment. Forwarding all of it to a child process
    (``{**os.environ, ...}``, ``dict(os.environ)``, ``os.environ.copy()``) is allowed,
    and so is replacing it in a forked child (``os.environ.clear()``, ``.update(env)``)."""
    forwarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            forwarded.update(
                id(v) for k, v in zip(node.keys, node.values, strict=True) if k is None
            )
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "dict" and len(node.args) == 1:
                forwarded.add(id(node.args[0]))
            elif isinstance(f, ast.Attribute) and (
                (f.attr == "copy" and not node.args) or f.attr in ("clear", "update")
            ):
                forwarded.add(id(f.value))
    lines = []
    for node in ast.walk(tree):
        if _is_os_attr(node) and id(node) not in forwarded:
            lines.append(node.lineno)  # type: ignore[attr-defined]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in ENV_NAMES for a in node.names)
        ):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    ("code", "reads"),
    [
        ("import os\nx = os.environ['HOME']", True),
        ("import os\nx = os.environ.get('HOME')", True),
        ("import os\nx = os.getenv('HOME')", True),
        ("import os\nx = 'HOME' in os.environ", True),
        ("from os import environ", True),
        ("import os\nenv = {**os.environ, 'A': '1'}", False),
        ("import os\nenv = dict(os.environ)", False),
        ("import os\nenv = os.environ.copy()", False),
        ("import os\nos.environ.clear()\nos.environ.update({'A': '1'})", False),
        ("import os\nos.environ.update(os.environ)", True),
        ("import os\nx = os.path.join('a', 'b')", False),
    ],
)
def test_environment_checker(code: str, reads: bool) -> None:
    assert bool(_reads_environment(ast.parse(code))) is reads


def test_only_the_cli_reads_the_environment() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert any(f.name == "cli.py" for f in files)
    offenders = {}
    for f in files:
        if f == SRC / "cli.py":
            continue
        lines = _reads_environment(ast.parse(f.read_text(), filename=str(f)))
        if lines:
            offenders[str(f.relative_to(SRC))] = lines
    assert not offenders, f"only cli.py may read os.environ: {offenders}"
    assert _reads_environment(ast.parse((SRC / "cli.py").read_text()))
