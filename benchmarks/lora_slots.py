"""LoRA slots inside a runtime's graph against its served graph, in process.

``python -m benchmarks lora-slots [--runtime openvino|onnx]`` loads the bundled MiniLM
on the runtime (the served graph) and makes its graph with LoRA slots on query, key,
value and dense (``runtimes/graph_slots.py``), makes 8 random rank-16 adapters there,
and times one batch of random token ids through each at the given precision: the
served graph; the slot graph with every row on slot 0 (no adapter), with the rows
spread over the 8 adapters, and with one adapter on every row (the adapters as
``python -m benchmarks lora`` makes them). The phases alternate in rounds; medians over
rounds of the median of each round's batches. Prints the table and writes JSON and a
PNG to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .fleet import machine_facts
from .lora_models import MINILM, base_dir, make_adapters

if TYPE_CHECKING:
    from fleetserve.runtimes.lora_slots import SlotGraph

TARGETS = ("query", "key", "value", "dense")
SHAPES = ((32, 24), (8, 64), (64, 16))  # (rows, tokens) of a batch


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks lora-slots")
    p.add_argument("--runtime", default="openvino", choices=("openvino", "onnx"))
    p.add_argument("--precision", default="", help="fp32, bf16 [bf16 on openvino, fp32 on onnx]")
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=15, help="timed batches a phase a round")
    p.add_argument("--out", default="docs/bench", help="directory for the JSON")
    return p


def main(argv: Sequence[str] = ()) -> int:
    from fleetserve.lora.load import read_adapter
    from fleetserve.lora.train.trainer import BERT_TARGETS
    from fleetserve.runtimes import Head, Output, create_runtime

    args = _parser().parse_args(list(argv))
    args.precision = args.precision or ("bf16" if args.runtime == "openvino" else "fp32")
    assert tuple(BERT_TARGETS) == TARGETS  # the slots a graph starts with
    base = base_dir(MINILM)
    with tempfile.TemporaryDirectory(prefix="lora-slots-") as tmp:
        work = Path(tmp)
        adapters = make_adapters(MINILM, work, args.adapters, rank=args.rank, targets=TARGETS)
        rt: Any = create_runtime(args.runtime, device="cpu", precision=args.precision,
                                 cache_dir=work / "cache", adapter_slots=args.adapters,
                                 max_rank=args.rank)  # fmt: skip
        rt.load(base, Head.BASE)
        rt.prepare_adapters()
        slots: SlotGraph = rt.lora_bank().model
        for i, path in enumerate(adapters):
            weights, scaling = read_adapter(path)
            slots.put(i + 1, {m: (a.numpy(), b.numpy()) for m, (a, b) in weights.items()},
                      scaling)  # fmt: skip
        rows: list[dict[str, Any]] = []
        for n, seq in SHAPES:
            ids = np.random.default_rng(0).integers(1000, 20000, (n, seq))
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                    "token_type_ids": np.zeros_like(ids)}  # fmt: skip

            def served(f: dict[str, Any] = feed) -> object:
                return rt.run(f["input_ids"], f["attention_mask"], Output.MEAN,
                              f["token_type_ids"])  # fmt: skip

            phases = {"base": served, **_phases(slots, feed, args.adapters)}
            seconds = _rounds(phases, args.rounds, args.batches)
            rows.append({"rows": n, "tokens": seq, "seconds": seconds})
    facts = machine_facts()
    out = {"machine": facts, "runtime": args.runtime, "precision": args.precision,
           "adapters": args.adapters,
           "rank": args.rank, "targets": list(TARGETS), "shapes": rows}  # fmt: skip
    print(f"{facts.get('hardware_class', '?')}, {args.runtime} {args.precision}, "
          f"{args.adapters} adapters of rank {args.rank}; texts/s (ratio to the base)")  # fmt: skip
    for r in rows:
        base_s = r["seconds"]["base"]
        cells = [f"{p} {r['rows'] / s:,.0f} ({base_s / s:.2f})" for p, s in r["seconds"].items()]
        print(f"{r['rows']}x{r['tokens']}: " + "; ".join(cells))
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    cls = facts.get("hardware_class", "unknown")
    path = dest / (f"lora-slots-{cls}.json" if args.runtime == "openvino"
                   else f"lora-slots-{args.runtime}-{cls}.json")  # fmt: skip
    path.write_text(json.dumps(out, indent=1))
    plot(out, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    """Texts/s of each phase, a group of bars a batch shape."""
    from .fleet_report import _pyplot

    plt = _pyplot()
    shapes = result["shapes"]
    phases = list(shapes[0]["seconds"])
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / len(phases)
    for k, phase in enumerate(phases):
        xs = [i + k * width for i in range(len(shapes))]
        ax.bar(xs, [r["rows"] / r["seconds"][phase] for r in shapes], width, label=phase)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
    ax.set_xticklabels([f"{r['rows']} x {r['tokens']}" for r in shapes])
    ax.set_xlabel("batch: rows x tokens")
    ax.set_ylabel("texts/s")
    ax.legend(fontsize=8)
    m = result["machine"]
    ax.set_title(f"LoRA slots in the {result.get('runtime', 'openvino')} graph, "
                 f"{result['precision']}, "
                 f"{result['adapters']} adapters of rank {result['rank']}\n"
                 f"{m.get('hardware_class', '?')}: {m.get('lscpu_model_name', '?')}",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _phases(
    slots: SlotGraph, feed: dict[str, Any], adapters: int
) -> dict[str, Callable[[], object]]:
    """One batch of ``feed`` through the slots: none, the rows spread over the
    ``adapters``, one adapter for every row."""
    from fleetserve.runtimes import Output

    n = len(feed["input_ids"])

    def through(slot: Any) -> Callable[[], object]:
        return lambda: slots.run(feed, slot, Output.MEAN)

    return {
        "no adapter": through(np.zeros(n, np.int64)),
        "mixed": through(np.arange(n) % adapters + 1),
        "one adapter": through(np.ones(n, np.int64)),
    }


def _rounds(phases: dict[str, Callable[[], object]], rounds: int, batches: int) -> dict[str, float]:
    """Each phase's median batch seconds, a median over alternating rounds."""
    seen: dict[str, list[float]] = {p: [] for p in phases}
    for _ in range(rounds):
        for phase, run in phases.items():
            for _ in range(3):
                run()  # warm
            times = []
            for _ in range(batches):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            seen[phase].append(statistics.median(times))
    return {p: statistics.median(v) for p, v in seen.items()}
