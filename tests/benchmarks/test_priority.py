"""``python -m benchmarks priority``: the load's bookkeeping, the report, and the whole
benchmark at its smallest against the tiny model (real servers, seconds)."""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from benchmarks import hop
from benchmarks.priority import main
from benchmarks.priority_infinity import venv_ready
from benchmarks.priority_load import Bodies, Load, Sample, build_workload, phase, tally
from benchmarks.priority_report import print_tables, summarize, verdicts, write
from fleetserve.settings import Settings

from ..conftest import NO_USER_PROFILES, TINY, TINY_CLASS

ROOT = Path(__file__).resolve().parents[2]
INFINITY_VENV = ROOT / ".bench" / "infinity-venv"
PNG = b"\x89PNG\r\n\x1a\n"


def bodies(n_queries: int = 3) -> Bodies:
    return Bodies(
        bulk=[b"bulk-0", b"bulk-1"],
        tokens=[100, 300],
        items=[10, 30],
        queries=[f"q{i}".encode() for i in range(n_queries)],
    )


def test_bulk_work_is_prorated_over_each_request_and_queries_kept_in_the_window() -> None:
    bulk = [
        (0.0, 2.0, 0, 200),  # half of it in [1, 3]: 50 tokens, 5 items
        (2.0, 3.0, 1, 200),  # all of it: 300 tokens, finished in the window
        (2.5, 4.5, 0, 200),  # a quarter: 25 tokens
        (3.5, 4.0, 1, 200),  # after the window: nothing
        (1.5, 2.0, 1, 503),  # a failure in the window
    ]
    queries = [(0.5, 0.6, 200), (1.2, 1.25, 200), (2.9, 3.2, 200), (2.95, 3.0, 0)]
    s = tally(bodies(), bulk, queries, start=1.0, end=3.0, drained=4.5)
    assert s.seconds == 2.0 and s.drain_s == 1.5
    assert s.bulk_tokens == pytest.approx(50 + 300 + 25)
    assert s.bulk_items == pytest.approx(5 + 30 + 2.5)
    assert s.bulk_tokens_per_s == pytest.approx(375 / 2)
    assert (s.bulk_done, s.bulk_errors) == (2, 1)
    assert s.query_ms == pytest.approx([50.0, 300.0])  # scheduled in [1, 3] only
    assert s.query_errors == 1 and s.error_codes == {503: 1, 0: 1}
    assert s.query(0.5) == pytest.approx(175.0)
    assert s.query(0.99) == pytest.approx(300.0)


async def test_a_phase_drives_bulk_closed_loop_and_queries_open_loop() -> None:
    seen: list[tuple[bytes, str | None]] = []

    async def server(request: httpx.Request) -> httpx.Response:
        body = request.content
        seen.append((body, request.headers.get("x-priority")))
        await asyncio.sleep(0.05 if body.startswith(b"bulk") else 0.005)
        return httpx.Response(200, content=b"{}")

    load = Load(bulk_clients=2, rate=40.0, seconds=0.5, warm=0.1, header=True, seed=1)
    s = await phase("http://x/v1/embeddings", bodies(), load, httpx.MockTransport(server))
    assert 12 <= s.bulk_done <= 22  # 2 clients x 0.5 s / 50 ms
    assert s.bulk_tokens_per_s > 0 and s.bulk_errors == 0
    assert 5 <= len(s.query_ms) <= 50  # Poisson 40/s over 0.5 s
    assert all(4 < x < 100 for x in s.query_ms)
    assert {h for b, h in seen if b.startswith(b"q")} == {"interactive"}
    assert {h for b, h in seen if b.startswith(b"bulk")} == {None}

    seen.clear()
    alone = Load(bulk_clients=1, rate=0.0, seconds=0.2, warm=0.0)
    s = await phase("http://x/", bodies(), alone, httpx.MockTransport(server))
    assert s.query_ms == [] and {b for b, _ in seen} <= {b"bulk-0", b"bulk-1"}


def test_the_workload_reads_the_corpus_or_falls_back_to_the_word_generator(
    tiny_catalog: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetserve.bench.tune import workload

    model = tiny_catalog.parent / "model"
    w = build_workload(model, max_seq_len=16, items=8, pool=3, seed=2)
    assert w == build_workload(model, max_seq_len=16, items=8, pool=3, seed=2)
    assert [len(b) for b in w.bulk] == [8, 8, 8] and len(w.tokens) == 3
    assert all(8 * 8 <= t <= 8 * 16 for t in w.tokens)  # truncated at max_seq_len
    assert "zaragoza" in w.source and w.queries[0].endswith("?")

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the mix workload reads the zaragoza-construction-faq package")

    monkeypatch.setattr(workload, "mix", missing)
    w = build_workload(model, max_seq_len=16, items=8, pool=2)
    assert "word generator" in w.source and len(w.queries) == 64
    assert all(len(b) == 8 for b in w.bulk)


def sample(tps: float, query_ms: list[float]) -> Sample:
    return Sample(seconds=1.0, bulk_tokens=tps, bulk_items=tps / 10, query_ms=query_ms)


def fake_result() -> dict[str, Any]:
    runs = {
        ("embedded", "alone"): [(sample(1000, []), 0.0), (sample(1200, []), 0.1)],
        ("embedded", "mixed"): [(sample(950, [10, 20, 90]), 0.0), (sample(1100, [15, 80]), 0.0)],
        ("embedded", "mixed+header"): [(sample(700, [5, 6]), 0.0), (sample(800, [7]), 0.0)],
        ("infinity-bf16-b32", "alone"): [(sample(500, []), 0.0)],
        ("infinity-bf16-b32", "mixed"): [(sample(490, [300.0, 900.0]), 0.0)],
    }
    failing = runs[("infinity-bf16-b32", "mixed")][0][0]
    failing.query_errors, failing.error_codes = 2, {500: 2}
    rows = summarize(runs, "cpu-test")
    lat = {"embedded": [4.0, 5.0, 6.0], "nats-pull": [8.0, 9.0]}
    hop_rows = hop.rows(lat, {"embedded": 0, "nats-pull": 1})
    args = {"bulk_clients": 4, "bulk_items": 256, "rate": 4.0, "repeats": 2, "seconds": 1.0}
    args |= {"hop_requests": 3, "hop_warmup": 1}
    search = [
        {"target": "infinity-fp32-b32", "tokens_per_s": 300.0, "min_cos": 1.0},
        {"target": "infinity-bf16-b32", "tokens_per_s": 500.0, "min_cos": 0.9999,
         "chosen": True},
        {"target": "infinity-int8-b32", "min_cos": 0.9, "eligible": False},
    ]  # fmt: skip
    return {"hardware_class": "cpu-test", "lscpu_model_name": "Test CPU", "args": args,
            "rows": rows, "hop": hop_rows, "infinity_search": search}  # fmt: skip


def test_medians_ratios_and_verdicts() -> None:
    result = fake_result()
    emb, header, inf = result["rows"]
    assert (emb["target"], emb["header"], header["header"]) == ("embedded", "none", "X-Priority")
    assert emb["bulk_alone_tokens_per_s"] == 1100 and emb["bulk_mixed_tokens_per_s"] == 1025
    assert emb["bulk_ratio"] == pytest.approx((0.95 + 1100 / 1200) / 2)  # per repeat
    assert emb["query_p99_ms"] == pytest.approx(85.0)  # median of 90 and 80
    assert emb["query_p99_pooled_ms"] == 90 and emb["queries"] == 5
    assert emb["met"] and not header["met"]  # 0.7x alone
    assert not inf["met"] and inf["hardware_class"] == "cpu-test"
    assert (inf["errors"], inf["error_codes"], emb["errors"]) == (2, {500: 2}, 0)
    nats = result["hop"][1]
    assert (nats["p50_ms"], nats["p50_over_first_ms"], nats["errors"]) == (8.5, 3.5, 1)
    assert not nats["met"] and result["hop"][0]["met"]
    lines = verdicts(result)
    assert "embedded (none): p99 85 ms, bulk 0.93x alone: met" in lines
    assert "hop: nats-pull p50 +3.50 ms over embedded (<= +3): missed" in lines


def narrow(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, wide


def test_report_writes_json_and_png_and_fits_80_columns(tmp_path: Path) -> None:
    console = Console(width=80, file=io.StringIO())
    result = fake_result()
    print_tables(result, console)
    path = write(tmp_path, "priority-cpu-test", result, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    narrow(text)
    assert "infinity-bf16-b32" in text and "below quality" in text and "+3.50 ms" in text
    data = json.loads(path.read_text())
    assert data["rows"][0]["repeats"][0]["query_p99_ms"] == 90
    assert data["verdicts"] == verdicts(result)
    assert path.with_suffix(".png").read_bytes().startswith(PNG)


def tiny_env(catalog: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in (
        ("profile_dir", NO_USER_PROFILES),
        ("hardware_class", TINY_CLASS),
        ("torch_threads", "1"),
    ):
        env[Settings.env_name(name)] = value
    return env


SMALLEST = ["--model", TINY, "--repeats", "1", "--seconds", "0.6", "--warm", "0.2"]
SMALLEST += ["--rate", "20", "--bulk-clients", "1", "--bulk-items", "8", "--bulk-pool", "2"]
SMALLEST += ["--quiet-wait", "0", "--hop-requests", "20", "--hop-warmup", "2"]
SMALLEST += ["--hop-blocks", "2"]


def run_smallest(tmp_path: Path, catalog: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "out"
    argv = [*SMALLEST, "--catalog", str(catalog), "--out", str(out)]
    argv += ["--logs", str(tmp_path / "logs"), *extra]
    assert main(argv, env=tiny_env(catalog)) == 0
    (path,) = out.glob("priority-*.json")
    assert path.with_suffix(".png").read_bytes().startswith(PNG)
    data: dict[str, Any] = json.loads(path.read_text())
    assert path.name == f"priority-{data['hardware_class']}.json"
    assert data["lscpu_model_name"] and data["hardware"]["class"] == data["hardware_class"]
    return data


def check_rows(data: dict[str, Any], target: str, variants: set[str]) -> None:
    rows = [r for r in data["rows"] if r["target"] == target]
    assert {r["variant"] for r in rows} == variants
    for r in rows:
        assert r["errors"] == 0 and r["queries"] > 0, r
        assert r["bulk_alone_tokens_per_s"] > 0 and r["bulk_mixed_tokens_per_s"] > 0
        assert r["hardware_class"] == data["hardware_class"]


def test_embedded_end_to_end(
    tiny_catalog: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_smallest(tmp_path, tiny_catalog, "--targets", "embedded", "--sections", "mixed")
    narrow(capsys.readouterr().out)
    check_rows(data, "embedded", {"mixed", "mixed+header"})
    assert "hop" not in data and data["workload"]["bulk_items_per_request"] == 8


def test_nats_pull_push_and_the_hop_end_to_end(
    tiny_catalog: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_smallest(tmp_path, tiny_catalog, "--targets", "nats,push")
    narrow(capsys.readouterr().out)
    check_rows(data, "nats-pull", {"mixed", "mixed+header"})
    check_rows(data, "nats-push-lor", {"mixed", "mixed+header"})
    assert not [r for r in data["rows"] if r["target"] == "embedded"]  # for the hop only
    assert [h["target"] for h in data["hop"]] == ["embedded", "nats-pull"]
    assert all(h["requests"] == 20 and h["errors"] == 0 for h in data["hop"])


def test_infinity_end_to_end(tiny_catalog: Path, tmp_path: Path) -> None:
    if not venv_ready(INFINITY_VENV):
        pytest.skip(f"no infinity venv at {INFINITY_VENV}: run benchmarks/infinity_venv.sh")
    data = run_smallest(
        tmp_path, tiny_catalog, "--targets", "infinity", "--sections", "mixed",
        "--infinity-venv", str(INFINITY_VENV), "--infinity-dtypes", "float32",
        "--infinity-batch-sizes", "8",
    )  # fmt: skip
    (cand,) = data["infinity_search"]
    assert cand["chosen"] and cand["target"] == "infinity-fp32-b8"
    check_rows(data, "infinity-fp32-b8", {"mixed"})


def test_targets_and_sections_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--targets", "embedded,tei"])
    assert "--targets: unknown tei" in capsys.readouterr().err
