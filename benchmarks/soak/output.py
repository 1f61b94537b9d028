"""A soak's files: ``soak-<mode>-<class>.json`` (everything), ``.md`` (the tables) and
``.png`` (RSS over time per process and in total, the disruptions marked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .report import series

MIB = 2**20


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v / MIB:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f} %"


def markdown(r: dict[str, Any]) -> str:
    req, run = r["requests"], r["run"]
    lines = [
        f"# Soak, {run['mode']} mode, {r['machine']['class']}",
        "",
        f"{run['minutes']:g} minutes of mixed traffic at {run['rate']:g} requests/s "
        f"(open loop, at most {run['max_in_flight']} in flight) over {', '.join(run['models'])}"
        + (f", and the LoRA adapter {run['adapter']}" if run.get("adapter") else "")
        + f". Machine: {r['machine']['summary']}; load average during the run "
        f"{r['load']['mean']:.2f} (max {r['load']['max']:.2f}).",
        "",
        f"Settings given to every process: {run.get('settings', {})}; the SDK retries 429 "
        f"and 503 up to {run.get('retries')} times, {run.get('timeout_s')} s per attempt.",
        "",
        f"Ready {run.get('ready_s', '-')} s after start; then one request of each kind, "
        f"before the clock starts (their seconds: {run.get('first_request_s', {})}).",
        "",
        f"Warm-up ends at {r['warmup_end_s']:g} s; growth compares the median RSS of the "
        f"{r['window_s']:g} s after it with that of the last {r['window_s']:g} s of traffic.",
        "",
        "## Targets",
        "",
        *[f"- {k}: {'met' if v else '**not met**'}" for k, v in r["targets"].items()],
        "",
        "## RSS (MiB)",
        "",
        "| series | after warm-up | last window | peak | growth | growth after disruptions |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, g in r["rss"].items():
        lines.append(
            f"| {name} | {_mib(g['first'])} | {_mib(g['last'])} | {_mib(g['peak'])} "
            f"| {_pct(g['growth_pct'])} | {_pct(g.get('after_events_pct'))} |"
        )
    if r.get("calm_from_s") is not None:
        lines += [
            "",
            f"Growth after disruptions: from the {r['window_s']:g} s after "
            f"{r['calm_from_s']:g} s (the last disruption over, plus 15 s) to the last window.",
        ]
    lines += [
        "",
        "## Requests",
        "",
        f"- sent {req['sent']}, served {req['served']}, lost {req['lost']}, "
        f"wrong answers {req['bad_answers']}, retried {req['retried']}",
        f"- errors by status (final answers): {req['errors_by_status'] or 'none'}",
        f"- every attempt by status: {req['attempts_by_status']}",
        f"- 503s during disruptions (retried through): {req['expected_503']}; "
        f"other 5xx: {req['unexpected_5xx']} (final 5xx answers: {req['final_5xx']})",
        f"- mean wait for an in-flight slot: {req['mean_slot_delay_s']} s",
        "",
        "| request | sent | served | p50 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, o in req["ops"].items():
        lines.append(f"| {name} | {o['sent']} | {o['ok']} | {o['p50_ms']} | {o['p99_ms']} |")
    lines += ["", "## Disruptions", ""]
    if not r["events"]:
        lines.append(f"- none: {run.get('no_disruption', '')}")
    for e in r["events"]:
        facts = {k: v for k, v in e.items() if k not in ("event", "start", "end", "at_s")}
        lines.append(f"- {e['at_s']:g} s: {e['event']} {facts}")
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = series(r["samples"], r["roles"])
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for name, points in sorted(s.items()):
        if name.startswith("role:"):
            continue
        ts, vs = zip(*points, strict=True)
        style = {"linewidth": 2.5, "color": "black"} if name == "total" else {}
        ax.plot(ts, [v / MIB for v in vs], label=name, **style)
    warm, win, end = r["warmup_end_s"], r["window_s"], r["run"]["seconds"]
    ax.axvspan(0, warm, color="grey", alpha=0.12, label="warm-up")
    for lo in (warm, end - win):
        ax.axvspan(lo, lo + win, color="tab:green", alpha=0.10)
    for e in r["events"]:
        for a in (ax, ax2):
            a.axvline(e["at_s"], color="tab:red", linestyle="--", linewidth=1)
        ax.annotate(e["event"], (e["at_s"], ax.get_ylim()[1]), fontsize=8, va="top", rotation=90)
    total = r["rss"].get("total", {}).get("growth_pct")
    ax.set_title(
        f"soak {r['run']['mode']} ({r['machine']['class']}): RSS, total growth "
        f"{'-' if total is None else f'{total:+.2f} %'} after warm-up"
    )
    ax.set_ylabel("RSS (MiB, process tree)")
    ax.legend(fontsize=8, loc="center right")
    ok = [o for o in r["requests_timeline"] if o[1] == "ok"]
    bad = [o for o in r["requests_timeline"] if o[1] != "ok"]
    bins = list(range(0, int(end) + 11, 10))
    ax2.hist([o[0] for o in ok], bins=bins, label="served / 10 s", color="tab:blue", alpha=0.7)
    if bad:
        ax2.hist([o[0] for o in bad], bins=bins, label="not served", color="tab:red")
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("requests")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, stem: str, r: dict[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    paths[0].write_text(json.dumps(r, indent=1, default=str) + "\n")
    paths[1].write_text(markdown(r))
    plot(r, paths[2])
    return paths
