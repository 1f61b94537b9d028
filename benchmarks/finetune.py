"""A LoRA from pairs, through the public API: ``python -m benchmarks finetune``.

For each language of the FAQ set (benchmarks/finetune_data.py), against a
``fleetserve serve`` child serving the bundled all-MiniLM-L6-v2:

1. upload the training and held-out pairs (``POST /v1/files``) and start a job
   (``POST /v1/fine_tuning/jobs``); follow it until it ends;
2. note when the job says it succeeded and time the first ``base:adapter`` call;
3. measure both models again *through the API* on the held-out questions (the same
   metric library), to check the job's figures against what is served;
4. all along, a probe sends one-sentence queries (interactive) a few times a second:
   their latency before any job (idle) and while the job trains.

The cost is the job's wall time at ``--price`` per machine-hour. Writes
``finetune-<class>.json``, ``.md`` and ``.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleetserve import Client
from fleetserve.lora.train.ireval import build_eval_set, evaluate
from fleetserve.wire.finetune import Pair

from . import finetune_data as data
from .fleet import machine_facts
from .fleet_server import Server

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# AWS c7i.large (2 vCPU, Sapphire Rapids with AMX), on-demand, us-east-1 (list price)
PRICE = 0.08925
HP = {"rank": 16, "alpha": 32, "epochs": 3, "learning_rate": 1e-3, "batch_size": 32}


class Probe:
    """One-sentence interactive queries every ``every`` seconds on a thread; latency
    samples tagged with the phase they fell in."""

    def __init__(self, url: str, every: float = 0.2) -> None:
        self.url, self.every = url, every
        self.phase = "idle"
        self.samples: list[tuple[str, float]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with Client(self.url, max_retries=0) as c:
            i = 0
            while not self._stop.wait(self.every):
                i += 1
                t0 = time.perf_counter()
                try:
                    c.encode(MODEL, [f"how long does a building permit take? ({i})"],
                             priority="interactive")  # fmt: skip
                except Exception:
                    self.errors += 1
                    continue
                self.samples.append((self.phase, (time.perf_counter() - t0) * 1e3))

    def ms(self, phase: str) -> list[float]:
        return [ms for p, ms in self.samples if p == phase]


def served_scores(c: Client, model: str, train: Sequence[Pair], held: Sequence[Pair]) -> Any:
    es = build_eval_set(train, held)
    q = np.asarray(c.encode(model, es.queries), dtype=np.float32)
    p = np.asarray(c.encode(model, es.passages), dtype=np.float32)
    return evaluate(q, p, es.relevant)


def run_language(c: Client, lang: str, folder: Path, probe: Probe, hp: dict[str, Any]) -> Any:
    train_path, held_path, n_train, n_held = data.write(lang, folder)
    train_file = c.upload_file(train_path)
    held_file = c.upload_file(held_path)
    job = c.create_fine_tuning_job(
        MODEL, train_file["id"], validation_file=held_file["id"], hyperparameters=hp,
        suffix=f"faq-{lang}",
    )  # fmt: skip
    t_created = time.monotonic()
    probe.phase = "queued"
    while True:
        job = c.get_fine_tuning_job(job["id"])
        status = job["status"]
        probe.phase = "training" if status == "running" else probe.phase
        if status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.05)
    t_done = time.monotonic()
    probe.phase = "after"
    row: dict[str, Any] = {"lang": lang, "pairs_train": n_train, "pairs_heldout": n_held,
                           "status": status, "job": job, "wall_s": t_done - t_created}  # fmt: skip
    name = job.get("fine_tuned_model")
    if status != "succeeded" or not name:
        return row
    t0 = time.monotonic()
    c.encode(name, ["first call of the new adapter"])
    row["first_call_s"] = time.monotonic() - t0  # after the job said it succeeded
    train_pairs = [Pair(p["query"], p["positive"]) for p in data.split(lang)[0]]
    held_pairs = [Pair(p["query"], p["positive"]) for p in data.split(lang)[1]]
    row["served_base"] = served_scores(c, MODEL, train_pairs, held_pairs).to_dict()
    row["served_adapter"] = served_scores(c, name, train_pairs, held_pairs).to_dict()
    return row


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks finetune")
    ap.add_argument("--langs", default="sv,en")
    ap.add_argument("--threads", type=int, default=1, help="train_threads of the server")
    ap.add_argument("--price", type=float, default=PRICE, help="USD per machine-hour")
    ap.add_argument("--idle", type=float, default=15.0, help="seconds of probing before")
    ap.add_argument("--hp", default="", help="hyperparameters as JSON (default: HP)")
    ap.add_argument("--out", type=Path, default=Path("docs/bench"))
    ap.add_argument("--tag", default="", help="in the files' names: finetune-<tag>-<class>")
    args = ap.parse_args(argv)
    hp = json.loads(args.hp) if args.hp else HP
    from .finetune_report import report

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = Server(
            "finetune", ["--models", MODEL, "--train-threads", str(args.threads),
                         "--train-price-per-hour", str(args.price),
                         "--cache-dir", str(folder / "cache")], folder / "logs",
        )  # fmt: skip
        try:
            server.wait_ready()
            rows = []
            with Client(server.url, timeout=600) as c, Probe(server.url) as probe:
                time.sleep(args.idle)  # the probe's idle phase
                for lang in args.langs.split(","):
                    rows.append(run_language(c, lang, folder / "data", probe, hp))
                    print(json.dumps({k: v for k, v in rows[-1].items() if k != "job"}))
            result = {**machine_facts(), "model": MODEL, "train_threads": args.threads,
                      "price_per_hour": args.price, "hyperparameters": hp, "runs": rows,
                      "probe": {p: probe.ms(p) for p in ("idle", "training", "after")},
                      "probe_errors": probe.errors}  # fmt: skip
        finally:
            server.stop()
    print(report(result, args.out, args.tag))
    return 0
