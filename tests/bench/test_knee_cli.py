"""``fleetserve bench knee`` end to end, against a real fleetserve on loopback port 0."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from fleetserve.bench import main as bench_main

from ..conftest import TINY, ServerThread


def knee(tmp_path: Path, catalog: Path, *args: str) -> int:
    common = ["--model", TINY, "--catalog", str(catalog), "--tokens", "12", "--texts", "32"]
    return bench_main(["knee", *common, "--out", str(tmp_path), "--name", "k", *args])


def test_two_rates_one_target(
    tiny_server: ServerThread,
    tiny_catalog: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = tiny_server.url + "/v1/embeddings"
    rc = knee(
        tmp_path,
        tiny_catalog,
        *("--target", f"tiny-fleet={url}", "--items", "2"),
        *("--rates", "20,40", "--duration", "0.5", "--slo-ms", "5000"),
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    data = json.loads((tmp_path / "k.json").read_text())
    (t,) = data["targets"]
    assert t["name"] == "tiny-fleet" and t["url"] == url and t["model"] == TINY
    assert [p["rate_rps"] for p in t["points"]] == [20, 40]
    assert all(p["errors"] == 0 and p["achieved_rps"] > 0 for p in t["points"])
    assert set(t["points"][0]) == {
        "rate_rps",
        "offered_rps",
        "achieved_rps",
        "offered_tokens_s",
        "achieved_tokens_s",
        "p50_ms",
        "p99_ms",
        "errors",
    }
    assert t["knee"]["slo_ms"] == 5000 and t["knee"]["method"] == "slo"
    assert data["workload"]["tokens"]["min"] == data["workload"]["tokens"]["max"] == 12
    md = (tmp_path / "k.md").read_text()
    assert "tiny-fleet" in md and "| offered/s |" in md
    png = (tmp_path / "k.png").read_bytes()
    assert png.startswith(b"\x89PNG") and b"tiny-fleet" in png  # the title, in metadata


def test_mix_automatic_rates_two_targets_interleaved(
    tiny_server: ServerThread,
    tiny_catalog: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip(
        "zaragoza_construction_faq", reason="the corpus package (dev extra) is not installed"
    )
    url = tiny_server.url + "/v1/embeddings"
    rc = knee(
        tmp_path,
        tiny_catalog,
        *("--target", f"a={url}", "--target", url, "--target-model", f"a={TINY}"),
        *("--workload", "mix", "--items", "1", "--points", "2"),
        *("--probe-s", "0.3", "--probe-concurrency", "2", "--duration", "0.3"),
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "closed-loop" in out and "tokens per text: min" in out
    data = json.loads((tmp_path / "k.json").read_text())
    names = [t["name"] for t in data["targets"]]
    assert names == ["a", url.split("//")[1].split("/")[0]]  # unnamed: host:port
    assert all(t["capacity_rps"] > 0 for t in data["targets"])
    # --points 2, or up to twice that where the two probes differ (on a loaded machine they
    # may, though both hit one server): the rates span each target's capacity
    assert 2 <= len(data["rates_rps"]) <= 4
    assert all(len(t["points"]) == len(data["rates_rps"]) for t in data["targets"])
    assert data["rates_rps"][1] > data["rates_rps"][0]
    stats = data["workload"]["tokens"]
    assert 8 <= stats["min"] <= stats["median"] <= stats["p90"] <= stats["max"] <= 256
    # interleaved: each rate for every target before the next rate
    md = (tmp_path / "k.md").read_text().splitlines()
    rows = [line.split(" | ")[1] for line in md if line.startswith("| ") and " | " in line]
    assert rows[-4:] == [names[0], names[1], names[0], names[1]]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("target", ["bad=http://127.0.0.1:{port}/v1/embeddings", "not-a-url"])
def test_a_bad_target_is_one_line(
    target: str, tiny_catalog: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = target.format(port=_closed_port())
    rc = knee(tmp_path, tiny_catalog, "--target", target, "--rates", "1", "--duration", "0.1")
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("fleetserve bench knee: error:") and "Traceback" not in err
    assert not (tmp_path / "k.json").exists()


def test_bench_lists_what_it_offers(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main([]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in ("knee", "sim", "cost", "python -m benchmarks"))
    for moved in ("embed", "dist", "http", "families"):
        assert bench_main([moved, "--rounds", "1"]) == 2
        assert f"python -m benchmarks {moved}" in capsys.readouterr().err
    assert bench_main(["--help"]) == 0
    assert "knee" in capsys.readouterr().out


def test_bench_cost_is_the_cost_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["cost", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fleetserve bench cost") and "--workload" in out
