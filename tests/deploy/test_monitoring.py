"""Grafana dashboard and Prometheus alerts: promtool checks them, and every metric and
label they use is one fleetserve's registry really has."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "fleetserve.json"
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$model": ".*"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan"}  # fmt: skip
TARGET_LABELS = {"instance", "job"}  # Prometheus adds them to every scraped series
SCRAPE_SERIES = {"up"}  # what Prometheus itself writes for each target


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60)


def exported() -> dict[str, set[str]]:
    """Series name -> label names, for every series fleetserve's registry can expose."""
    out: dict[str, set[str]] = {}
    for metric in vars(Metrics()).values():
        kind = getattr(metric, "_type", None)
        if kind is None:
            continue
        name, labels = metric._name, set(metric._labelnames)
        suffixes = {
            "counter": ["_total", "_created"],
            "gauge": [""],
            "histogram": ["_bucket", "_sum", "_count", "_created"],
        }[kind]
        for s in suffixes:
            out[name + s] = labels | ({"le"} if s == "_bucket" else set())
    return out | {name: set(TARGET_LABELS) for name in SCRAPE_SERIES}


def dashboard_exprs() -> list[str]:
    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                yield node["expr"]
            for v in node.values():
                yield from walk(v)
        elif isinstance(node, list):
            for v in node:
                yield from walk(v)

    return list(walk(json.loads(DASHBOARD.read_text())))


def alert_exprs() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def grafana_to_promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def used(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """The metrics an expression selects (with the labels matched on each), and the
    labels it groups or joins by."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    selectors: dict[str, set[str]] = {}
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", expr):
        selectors.setdefault(m.group(1), set()).update(
            re.findall(r"([A-Za-z_]\w*)\s*[!=]", m.group(2))
        )
    grouping: set[str] = set()
    for m in re.finditer(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr
    ):
        grouping |= {s.strip() for s in m.group(1).split(",") if s.strip()}
    bare = re.sub(r"\{[^}]*\}", "", expr)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()", bare):
        if m.group(1).lower() not in KEYWORDS:
            selectors.setdefault(m.group(1), set())
    return selectors, grouping


def unknown_names(exprs: list[str]) -> list[str]:
    known = exported()
    problems = []
    for expr in exprs:
        selectors, grouping = used(expr)
        labels = set(TARGET_LABELS)
        for name, matched in selectors.items():
            if name not in known:
                problems.append(f"metric {name!r} (in {expr.strip()[:60]}...)")
                continue
            labels |= known[name]
            bad = matched - known[name] - TARGET_LABELS
            problems += [f"label {lab!r} on {name}" for lab in sorted(bad)]
        problems += [f"label {lab!r} in a grouping" for lab in sorted(grouping - labels)]
    return problems


def test_alert_rules_pass_promtool_check() -> None:
    done = run("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_alert_unit_tests_pass() -> None:
    done = run("test", "rules", str(ALERT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS.read_text()))
    assert len(tested) >= 2


def test_the_issues_alerts_are_there() -> None:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    names = {r["alert"] for g in groups for r in g["rules"]}
    wanted = {"FleetserveQueueLagGrowing", "FleetserveP99OverSLO", "FleetserveDeadLetters",
              "FleetserveEvictionsThrashing", "FleetserveWorkerDown",
              "FleetserveQueueStorageFull"}  # fmt: skip
    assert wanted <= names


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    exprs = [grafana_to_promql(e) for e in dashboard_exprs()]
    assert len(exprs) >= 20
    rules = [{"record": f"grafana:panel_query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = run("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_shows_what_the_issue_asks() -> None:
    text = " ".join(dashboard_exprs())
    for metric in ["fleetserve_requests_total", "fleetserve_stage_latency_seconds_bucket",
                   "fleetserve_queue_depth", "fleetserve_queue_lag_seconds",
                   "fleetserve_batch_fill_bucket", "fleetserve_put_backs",
                   "fleetserve_redeliveries", "fleetserve_dead_letters",
                   "fleetserve_model_evictions_total", "fleetserve_resident_bytes",
                   "fleetserve_memory_budget_bytes", "fleetserve_worker_up"]:  # fmt: skip
        assert metric in text, metric
    assert "histogram_quantile(0.5" in text and "histogram_quantile(0.99" in text


def test_every_metric_and_label_is_fleetserves() -> None:
    exprs = [grafana_to_promql(e) for e in dashboard_exprs()] + alert_exprs()
    assert unknown_names(exprs) == []


def test_the_name_check_catches_typos() -> None:
    assert unknown_names(["rate(fleetserve_request_total[5m])"]) == [
        "metric 'fleetserve_request_total' (in rate(fleetserve_request_total[5m])...)"
    ]
    assert unknown_names(['fleetserve_queue_depth{modle="a"}']) == [
        "label 'modle' on fleetserve_queue_depth"
    ]
    assert unknown_names(["sum by (class) (fleetserve_queue_depth)"]) == [
        "label 'class' in a grouping"
    ]
    assert unknown_names(["fleetserve_resident_bytes / fleetserve_memory_budget_bytes"]) == []
