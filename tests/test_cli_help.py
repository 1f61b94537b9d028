"""Each subcommand's ``--help`` lists only the settings it uses, readable at 80 columns,
and every flag the commands used to take still parses where it is used."""

from __future__ import annotations

import re

import pytest

from fleetserve.cli import _parser, main
from fleetserve.cli_groups import COMMAND_GROUPS


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


@pytest.fixture(autouse=True)
def columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.parametrize("cmd", sorted(COMMAND_GROUPS))
def test_help_fits_80_columns_and_is_short(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["lora", "list"] if cmd == "lora" else ["keys", "add"] if cmd == "keys" else [cmd]
    out = _help(argv, capsys)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    usage = out.split("\n\n", 1)[0]
    assert len(usage.splitlines()) <= 4, usage  # not one [--flag X] per setting
    assert "--log-level" in out and "--log-format" in out and "--config" in out


@pytest.mark.parametrize(
    ("argv", "absent"),
    [
        (["models"], ("--nats", "--max-body-bytes", "--auth", "--payload-store", "--devices")),
        (["dlq"], ("--models", "--memory-budget", "--s3-endpoint", "--port", "--api-key")),
        (["serve"], ("--nats", "--devices", "--worker-id", "--payload-store", "--queue-prefix")),
        (["gateway"], ("--memory-budget", "--devices", "--eviction", "--torch-threads")),
        (["keys", "add"], ("--nats", "--port", "--models", "--api-key")),
        (["lora", "list"], ("--nats", "--models", "--memory-budget", "--s3-endpoint")),
        (["hardware"], ("--nats", "--port", "--api-key", "--memory-budget")),
    ],
)
def test_help_lists_only_the_settings_used(
    argv: list[str], absent: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    out = _help(argv, capsys)
    flags = {line.split()[0].rstrip(",") for line in out.splitlines() if line.startswith("  --")}
    assert "--log-level" in flags
    for flag in absent:
        assert flag not in flags, (argv, flag)


def test_the_help_groups_settings_under_headings(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(["dlq"], capsys)
    assert "NATS JetStream:" in out and "--nats-connect-timeout" in out
    assert out.index("NATS JetStream:") < out.index("logging and config:")


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "0", "--api-key", "k", "--keys-file", "f", "--auth", "keys",
         "--models", "m", "--catalog", "c", "--device", "cpu", "--torch-threads", "1",
         "--profile-dir", "p", "--hardware-class", "h", "--memory-budget", "1GiB",
         "--tune", "quick", "--hf-cache", "x", "--max-body-bytes", "9", "--access-log", "false",
         "--config", "c.yaml", "--log-format", "json", "--adapter-store", "file:///x"],
        ["gateway", "--nats", "nats://x", "--nats-connect-timeout", "0.5", "--port", "0",
         "--payload-store", "memory://", "--s3-endpoint", "e", "--queue-prefix", "p"],
        ["worker", "--nats", "nats://x", "--devices", "cpu:0,cpu:1", "--worker-id", "w",
         "--train", "--models", "m", "--catalog", "c", "--queue-prefix", "p",
         "--stream-storage", "memory", "--ack-wait", "2", "--max-batch-tokens", "64",
         "--log-level", "debug", "--worker-port", "0", "--tune", "quick"],
        ["cluster", "--workers", "2", "--port", "0", "--store-dir", "d", "--devices", "cpu:0"],
        ["dlq", "list", "--nats", "nats://x", "--queue-prefix", "p", "--request-timeout", "3"],
        ["models", "prepare", "a", "--runtime", "onnx", "--precision", "int8", "--catalog", "c",
         "--cache-dir", "d", "--device", "cpu", "--hf-cache", "h", "--port", "1"],
        ["hardware", "--profile-dir", "p"],
        ["tune", "m", "--catalog", "c", "--budget", "1", "--tune-dir", "t", "--cache-dir", "d",
         "--device", "cpu", "--output", "o"],
        ["lora", "list", "--url", "http://x", "--api-key", "k", "--host", "h", "--port", "1"],
        ["keys", "add", "--tenant", "t", "--file", "f", "--keys-file", "f"],
    ],
)  # fmt: skip
def test_the_flags_each_command_uses_still_parse(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert args.command == argv[0]


def test_worker_only_flags_are_refused_by_serve(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--devices", "cpu:0"])
    assert "unrecognized arguments: --devices" in capsys.readouterr().err


def test_serve_help_shows_the_common_flags_and_help_all_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    short = _help(["serve"], capsys)
    assert len(short.splitlines()) <= 80, len(short.splitlines())  # every flag: 360 lines
    assert "--port" in short and "--models" in short and "--max-body-bytes" not in short
    assert re.search(r"\d+ more flags: fleetserve serve --help-all lists them\.", short)
    everything = _help(["serve", "--help-all"], capsys)
    assert "--max-body-bytes" in everything and "more flags" not in everything
    assert max(len(line) for line in everything.splitlines()) <= 80
    args = _parser().parse_args(["serve", "--max-body-bytes", "9"])  # unlisted, still taken
    assert args.max_body_bytes == 9
