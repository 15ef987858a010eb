"""``murmur simulate``: run a simulated swarm, print progress, write ``sim.jsonl`` and a plot.

``sim.jsonl`` holds one ``sample`` record per sample of the swarm (simulated time ``t`` in
seconds) and a final ``summary`` record; ``sim.png`` plots consensus distance, accuracy of the
averaged model and of the worst node, and bytes per node over simulated time.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO

from gossip.topology import resolved
from node.cli.plots import Panel, plot_panels
from node.sim.config import SimConfig
from node.sim.swarm import Sample, Simulation, Summary

__all__ = ["JSONL_FILE", "PLOT_FILE", "run_simulation"]

JSONL_FILE = "sim.jsonl"
PLOT_FILE = "sim.png"


def _progress_line(s: Sample, metric: str = "accuracy") -> str:
    judged = (
        f"acc avg={s.avg_accuracy:.3f} worst={s.worst_accuracy:.3f}"
        if metric == "accuracy"
        else f"loss avg={s.avg_loss:.3f} worst={s.worst_loss:.3f}"
    )
    return (
        f"t={s.t:7.1f}s live={s.live:5d} consensus={s.consensus_distance:9.3g} "
        f"(rel {s.relative_distance:8.2g}) {judged} rounds={s.rounds_per_node:7.1f} "
        f"sent/node={s.bytes_per_node / 2**20:8.2f} MiB{_views(s)}  [wall {s.wall_s:6.1f}s]"
    )


def _views(s: Sample) -> str:
    return f" partial views={s.partial_views}" if s.partial_views else ""


def plot(samples: list[Sample], path: Path, title: str, metric: str = "accuracy") -> None:
    def series(value: str) -> list[tuple[float, float]]:
        return [(s.t, float(getattr(s, value))) for s in samples]

    kind = "accuracy" if metric == "accuracy" else "loss"

    plot_panels(
        [
            Panel(
                "consensus distance (1/n) Σ ||x_i - x̄||²",
                "distance",
                {"consensus distance": series("consensus_distance")},
                log_scale=True,
            ),
            Panel(
                f"{kind} on the held-out set",
                kind,
                {
                    "averaged model": series(f"avg_{kind}"),
                    "worst node": series(f"worst_{kind}"),
                    "mean of nodes": series(f"mean_{kind}"),
                },
            ),
            Panel(
                "gossip bytes sent per node",
                "MiB",
                {"deltas and snapshots": [(t, b / 2**20) for t, b in series("bytes_per_node")]},
            ),
            Panel("live nodes", "nodes", {"training": series("live")}),
        ],
        path,
        title,
        "simulated seconds",
    )


def run_simulation(cfg: SimConfig, out_dir: Path, progress: IO[str] | None = sys.stdout) -> Summary:
    """Run ``cfg`` to the end; write ``sim.jsonl`` and ``sim.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    g = cfg.gossip
    title = (
        f"{cfg.nodes} nodes, {resolved(g.topology, cfg.nodes)}, {g.codec}, task {cfg.task}, "
        f"H={g.local_steps}, seed {cfg.seed}"
    )
    if g.robust:
        title += f", robust (δ {g.byzantine_fraction:g})"
    if g.outer_lr:
        title += f", outer lr {g.outer_lr:g}"
    if cfg.attacker_count:
        title += f", {cfg.attacker_count} attacking ({g.attack})"
    if progress is not None:
        print(f"murmur simulate: {title}; {cfg.duration_s:g} simulated seconds", file=progress)
    started = time.perf_counter()
    sim = Simulation(cfg)
    if progress is not None:
        print(f"  built in {time.perf_counter() - started:.1f} s", file=progress, flush=True)
    with (out_dir / JSONL_FILE).open("w") as f:
        f.write(json.dumps({"record": "config", **asdict(cfg)}) + "\n")

        def on_sample(s: Sample) -> None:
            f.write(json.dumps({"record": "sample", **asdict(s)}) + "\n")
            f.flush()
            if progress is not None:
                print(_progress_line(s, sim.metric), file=progress, flush=True)

        summary = sim.run(on_sample)
        f.write(json.dumps({"record": "summary", **asdict(summary)}) + "\n")
    plot(sim.samples, out_dir / PLOT_FILE, title, sim.metric)
    if progress is not None:
        print(format_summary(summary, cfg), file=progress)
        print(f"wrote {out_dir / JSONL_FILE} and {out_dir / PLOT_FILE}", file=progress)
    return summary


def _when(t: float | None) -> str:
    return "not reached" if t is None else f"{t:.1f} s"


def _target(s: Summary) -> str:
    target = "none" if s.target is None else f"{s.target:g}"
    return f"accuracy {target}" if s.metric == "accuracy" else f"eval loss {target}"


def _final(s: Summary) -> str:
    f = s.final
    if s.metric == "accuracy":
        return (
            f"averaged {f.avg_accuracy:.3f}, worst {f.worst_accuracy:.3f}, "
            f"best {f.best_accuracy:.3f}"
        )
    text = f"eval loss averaged {f.avg_loss:.3f}, worst {f.worst_loss:.3f}"
    if s.metric == "perplexity":
        text += f" (perplexity {math.exp(min(f.avg_loss, 700)):.2f})"
    return text


def format_summary(s: Summary, cfg: SimConfig) -> str:
    rounds = "" if s.consensus_rounds is None else f" ({s.consensus_rounds:.0f} rounds)"
    split = cfg.net.partition
    healed = (
        [
            f"partition into {split.groups} groups at {split.at_s:g} s for {split.for_s:g} s: "
            f"one view again {_when(s.healed_s)} after it ended (sampled every "
            f"{cfg.eval_every_s:g} s)"
        ]
        if split is not None
        else []
    )
    return "\n".join(
        [
            *healed,
            f"consensus (relative distance <= {cfg.consensus_threshold:g}): "
            f"{_when(s.consensus_s)}{rounds}",
            f"target {_target(s)}: averaged model {_when(s.target_avg_s)}, "
            f"worst node {_when(s.target_worst_s)}",
            f"final: {_final(s)}, "
            f"{s.bytes_per_node / 2**20:.2f} MiB sent per node "
            f"({s.bytes_per_node_per_round:.0f} B per round)",
            f"simulator: {s.wall_s:.1f} s wall, {s.events} events, "
            f"{s.tensor_bytes_per_node / 1024:.1f} KiB of tensors per node",
        ]
    )
