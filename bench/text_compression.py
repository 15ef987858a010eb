"""Compression on the text task: murmur's codecs against all-reduce at the same number of samples.

    .venv/bin/python -m bench.text_compression [--nodes 8] [--steps 200]
        [--task text:size=1m,seq_len=64,batch_size=8] [--codecs fp32,int8,int4,sign]
        [--local-steps H] [--outer-lr LR] [--topology GRAPH] [--out bench/results/text-compression]

Each codec runs as ``murmur simulate`` does (node/sim: the daemon's core, every node of the
swarm in this one process, on a discrete-event clock): ``--nodes`` nodes on the exponential
graph, each training ``--steps`` local steps of the task on its own shard (the text task's
shards are non-iid by package), one simulated second a step, over links fast enough (1 Gbit/s,
1-5 ms) that a round goes out after every step. The run stops when the step budget is spent,
so that every system has seen the same samples. All-reduce (bench/allreduce.py: DDP over gloo,
``--nodes`` processes, same shards, same batch order, same schedule) trains the same steps.

A codec may name its own consensus step size: ``--codecs sign@0.3``. ``--local-steps H`` makes a
round every H steps, ``--outer-lr`` adds the DiLoCo-style outer step (gossip/outer.py), and a
schedule (``--topology one-peer-exponential``) runs with a copy per link.

Reported: the eval loss of the averaged model and of the worst node at the end, and bytes sent
per node (murmur: deltas and snapshots as the node counts them; all-reduce: ring all-reduce's
2(n-1)/n of the fp32 gradient a step). Writes ``results.json``, ``compression.png`` (eval loss
against bytes per node) and ``compression.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.allreduce import AllReduceConfig, run_allreduce
from gossip.schedules import SCHEDULES
from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation

TASK = "text:size=1m,seq_len=64,batch_size=8"


def gossip_run(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    codec, _, gamma = spec.partition("@")  # "sign@0.3": sign with consensus step 0.3
    cfg = SimConfig(
        nodes=args.nodes,
        task=args.task,
        alpha=None,  # the text task shards by package whatever alpha says
        seed=0,
        step_time_s=1.0,
        steps=args.steps,
        duration_s=float(args.steps),  # the budget's end: the same samples as all-reduce
        eval_every_s=max(1.0, args.steps / args.points),
        gossip=GossipConfig(
            codec=codec,
            gamma=float(gamma) if gamma else None,
            local_steps=args.local_steps,
            topology=args.topology,
            pace="link" if args.topology in SCHEDULES else "node",
            outer_lr=args.outer_lr,
            outer_momentum=args.outer_momentum,
        ),
        net=NetConfig(latency_s=(0.001, 0.005), bandwidth_bps=1.25e8),
    )
    torch.manual_seed(0)
    started = time.perf_counter()

    def show(s: Any) -> None:
        print(
            f"  {codec} t={s.t:.0f} avg loss {s.avg_loss:.4f} worst {s.worst_loss:.4f} "
            f"{s.bytes_per_node / 1e6:.1f} MB/node [{time.perf_counter() - started:.0f} s]",
            flush=True,
        )

    sim = Simulation(cfg)
    summary = sim.run(show)
    final = summary.final
    return {
        "system": f"murmur {codec}"
        + (f", γ {gamma}" if gamma else "")
        + ("" if args.topology == "exponential" else f", {args.topology}")
        + ("" if args.local_steps == 1 else f", H={args.local_steps}")
        + ("" if args.outer_lr is None else f", outer lr {args.outer_lr}"),
        "gamma": cfg.gossip.step_size,
        "avg_loss": final.avg_loss,
        "worst_loss": final.worst_loss,
        "mean_loss": final.mean_loss,
        "bytes_per_node": final.bytes_per_node,
        "rounds_per_node": final.rounds_per_node,
        "steps_per_node": final.steps_per_node,
        "consensus_distance": final.consensus_distance,
        "wall_s": time.perf_counter() - started,
        "curve": [(s.bytes_per_node, s.avg_loss, s.worst_loss) for s in sim.samples],
    }


def allreduce_run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cfg = AllReduceConfig(
        world=args.nodes,
        steps=args.steps,
        task=args.task,
        alpha=None,
        eval_every=max(1, args.steps // args.points),
    )
    started = time.perf_counter()
    results = asyncio.run(run_allreduce(cfg, workdir, timeout_s=6 * 3600))
    r = results[0]  # every worker holds the same model
    per_step = r["bytes_sent_model"] / max(r["steps"], 1)
    return {
        "system": "all-reduce",
        "avg_loss": r["evals"][-1]["loss"],
        "worst_loss": r["evals"][-1]["loss"],
        "mean_loss": r["evals"][-1]["loss"],
        "bytes_per_node": sum(x["bytes_sent_model"] for x in results) / len(results),
        "rounds_per_node": r["steps"],
        "steps_per_node": r["steps"],
        "consensus_distance": 0.0,
        "wall_s": time.perf_counter() - started,
        "curve": [(e["step"] * per_step, e["loss"], e["loss"]) for e in r["evals"]],
    }


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    fig = Figure(figsize=(9, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for r in results:
        sent = [(b / 1e6, a) for b, a, _ in r["curve"] if b > 0]  # nothing sent: off a log axis
        ax.plot(*zip(*sent, strict=True), marker="o", label=f"{r['system']} (average)")
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per node")
    ax.set_ylabel("eval loss (nats per byte)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, format="png")


def table(results: list[dict[str, Any]]) -> str:
    base = next((r for r in results if r["system"] == "all-reduce"), None)
    lines = [
        "| system | γ | eval loss, averaged model | vs all-reduce | worst node | "
        "MB sent per node | vs all-reduce | rounds per node |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        loss_ratio = f"{100 * (r['avg_loss'] / base['avg_loss'] - 1):+.2f}%" if base else "-"
        byte_ratio = f"1/{base['bytes_per_node'] / r['bytes_per_node']:.1f}" if base else "-"
        gamma = f"{r['gamma']:g}" if "gamma" in r else "-"
        lines.append(
            f"| {r['system']} | {gamma} | {r['avg_loss']:.4f} | {loss_ratio} | "
            f"{r['worst_loss']:.4f} | {r['bytes_per_node'] / 1e6:.1f} | {byte_ratio} | "
            f"{r['rounds_per_node']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--codecs", default="fp32,int8,int4,sign")
    parser.add_argument("--local-steps", type=int, default=1)
    parser.add_argument("--topology", default="exponential")
    parser.add_argument(
        "--outer-lr", type=float, default=None, help="DiLoCo-style outer step (gossip/outer.py)"
    )
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--points", type=int, default=5, help="evaluations along the run")
    parser.add_argument("--no-allreduce", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results/text-compression"))
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        help="instead of running: combine the results.json of runs made one system at a time",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    results: list[dict[str, Any]] = []
    if args.merge:
        for part in args.merge:
            results += json.loads((part / "results.json").read_text())["results"]
        results.sort(key=lambda r: r["system"] != "all-reduce")
        args.codecs = ""
    elif not args.no_allreduce:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(allreduce_run(args, Path(tmp)))
        print(f"all-reduce: {results[-1]['avg_loss']:.4f}", flush=True)
    for codec in filter(None, args.codecs.split(",")):
        results.append(gossip_run(codec, args))
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    title = f"{args.task}, {args.nodes} nodes, {args.steps} steps each"
    plot(results, args.out / "compression.png", title)
    text = f"{title}\n\n{table(results)}\n"
    (args.out / "compression.md").write_text(text)
    (args.out / "results.json").write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1
        )
    )
    print(text)


if __name__ == "__main__":
    main()
