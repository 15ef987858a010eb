"""Local steps and the outer step on the text task: ``--local-steps H`` with ``--outer-lr`` at
several H, eval loss against bytes sent, with real node processes.

    .venv/bin/python -m bench.local_steps [--nodes 4] [--steps 300] [--hs 1,10,50]
        [--outer-lr 0.7] [--task text:size=1m,seq_len=64,batch_size=8,warmup=20]
        [--codec int8] [--out bench/results/local-steps]

Each setting is a swarm of ``--nodes`` ``murmur run`` processes on loopback (as ``murmur
swarm`` starts them), each training ``--steps`` local steps on its own shard and gossiping at
most every H steps, with DiLoCo's outer Nesterov step (Douillard et al. 2023; gossip/outer.py)
on what each node's local steps changed since its last round. bench/sim_outer.py measures the
same step in the simulator; this is the text task with real processes. Every node evaluates
``--points`` times; the curve is the nodes' mean eval loss against their mean bytes sent. At
the end the nodes' final checkpoints are averaged and that model evaluated
(node/cli/evaluation.py), as ``murmur swarm`` reports it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.swarms import train_to_the_end
from node.cli.evaluation import evaluate_run
from node.cli.swarm import SwarmConfig
from node.config import GossipConfig
from node.daemon.node import METRICS_FILE
from node.telemetry.events import read_metrics

TASK = "text:size=1m,seq_len=64,batch_size=8,warmup=20"


def run(h: int, outer_lr: float | None, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cfg = SwarmConfig(
        nodes=args.nodes,
        steps=args.steps,
        task=args.task,
        alpha=None,
        eval_every=max(1, args.steps // args.points),
        gossip=GossipConfig(codec=args.codec, local_steps=h, outer_lr=outer_lr),
        insecure=True,
    )
    started = time.perf_counter()
    summaries = asyncio.run(train_to_the_end(cfg, workdir, together=True))
    wall = time.perf_counter() - started
    dirs = [workdir / f"node-{i}" for i in range(args.nodes)]
    logs = [[r for r in read_metrics(d / METRICS_FILE) if r["event"] == "eval"] for d in dirs]
    points = min(len(log) for log in logs)
    curve = [
        (
            sum(log[k]["bytes_sent"] for log in logs) / len(logs),
            sum(log[k]["loss"] for log in logs) / len(logs),
        )
        for k in range(points)
    ]
    report = evaluate_run(dirs, args.task, 0)
    return {
        "h": h,
        "outer_lr": outer_lr,
        "avg_loss": report.averaged_loss,
        "worst_loss": max(r.loss for r in report.nodes),
        "mean_trained_loss": sum(r.trained_loss for r in report.nodes) / len(report.nodes),
        "bytes_per_node": sum(s["bytes_sent"] for s in summaries) / len(summaries),
        "rounds_per_node": sum(s["rounds"] for s in summaries) / len(summaries),
        "consensus_distance": report.consensus_distance,
        "wall_s": wall,
        "curve": curve,
    }


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    fig = Figure(figsize=(9, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for r in results:
        outer = f", outer lr {r['outer_lr']:g}" if r["outer_lr"] else ""
        sent = [(b / 1e6, loss) for b, loss in r["curve"] if b > 0]  # nothing sent: off a log axis
        if sent:
            ax.plot(*zip(*sent, strict=True), marker="o", label=f"H={r['h']}{outer}")
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per node (mean)")
    ax.set_ylabel("eval loss of the nodes' own models (mean)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, format="png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--hs", default="1,10,50")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="0: no outer step")
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--codec", default="int8")
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("bench/results/local-steps"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    outer = args.outer_lr or None
    for h in (int(x) for x in args.hs.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(run(h, outer, args, Path(tmp)))
        r = results[-1]
        print(
            f"H={h}: averaged model eval loss {r['avg_loss']:.4f}, worst node "
            f"{r['worst_loss']:.4f}, {r['bytes_per_node'] / 1e6:.1f} MB/node, "
            f"{r['rounds_per_node']:.0f} rounds [{r['wall_s']:.0f} s]",
            flush=True,
        )
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    title = f"{args.task}, {args.nodes} nodes, {args.steps} steps, {args.codec}"
    plot(results, args.out / "local-steps.png", title)
    lines = [
        title,
        "",
        "| H | outer lr | eval loss, averaged model | worst node | MB sent per node | "
        "rounds per node |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['h']} | {r['outer_lr'] or '-'} | {r['avg_loss']:.4f} | {r['worst_loss']:.4f} | "
            f"{r['bytes_per_node'] / 1e6:.1f} | {r['rounds_per_node']:.0f} |"
        )
    (args.out / "local-steps.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
