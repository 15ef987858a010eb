"""Time-varying schedules in the daemon's simulator: ``--topology one-peer-exponential`` and
``--topology epidemic`` against the static exponential graph, all with a copy per link
(``--pace link``) and the static graph also with one public copy (``--pace node``), while
training (issue 19).

    python -m bench.sim_schedules_daemon [--nodes 16,64] [--duration 10] [--task digits]
        [--bandwidth 1.25e6] [--fanout 2] [--gamma G] [--plot DIR]

With ``--plot DIR`` it also draws, for each swarm size, the relative distance against time and
against the bytes a node sent (``DIR/schedules-N.png``).

Each run is ``murmur simulate`` with the graph named: the daemon's own nodes (codecs, replicas,
mixing, SWIM, link policy, trainer step) on simulated time, each node starting from a model of
its own so that consensus starts far, every uplink ``--bandwidth`` bytes a second (10 Mbit/s:
a delta of the digits MLP's 85k parameters in int8 takes 70 ms of it, so a delta to each of
the 11 links of a 64-node exponential graph takes 0.75 s: the bytes set the pace). The table
gives, for each graph, the seconds to consensus (relative distance 1e-2) and the relative
distance at the end, the seconds to the target (the averaged model, and the worst node), the
bytes a node sent, the deltas a node's round sent, the rounds a node made, and the last
sample's worst accuracy.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation

HEADER = (
    "| graph | consensus s | final rel. distance | target s (avg / worst) | KiB/node "
    "| deltas/round | rounds/node | worst acc | wall s |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


#: Each graph's samples: (simulated s, relative distance, KiB sent per node).
Curve = list[tuple[float, float, float]]


def run(
    name: str, gossip: GossipConfig, nodes: int, args: argparse.Namespace, curves: dict[str, Curve]
) -> str:
    cfg = SimConfig(
        nodes=nodes,
        task=args.task,
        seed=args.seed,
        independent_init=True,
        duration_s=args.duration,
        eval_every_s=0.5,
        gossip=gossip,
        net=NetConfig(bandwidth_bps=args.bandwidth),
    )
    began = time.perf_counter()
    sim = Simulation(cfg)
    summary = sim.run()
    members = list(sim.nodes.values())
    curves[name] = [
        (s.t, s.relative_distance, s.bytes_per_node / 1024) for s in sim.samples if s.t > 0
    ]
    deltas = sum(link.stats.deltas_sent for n in members for link in n.links.values())
    rounds = sum(n.counters.rounds for n in members)
    return (
        f"| {name} | {_fmt(summary.consensus_s)} | "
        f"{summary.final.relative_distance:.2g} | "
        f"{_fmt(summary.target_avg_s)} / {_fmt(summary.target_worst_s)} | "
        f"{summary.bytes_per_node / 1024:.0f} | {deltas / max(rounds, 1):.2f} | "
        f"{summary.final.rounds_per_node:.0f} | "
        f"{summary.final.worst_accuracy:.3f} | {time.perf_counter() - began:.0f} |"
    )


def plot(curves: dict[str, Curve], path: Path, title: str) -> None:
    fig = Figure(figsize=(11, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    by_time, by_bytes = fig.subplots(1, 2)
    for name, curve in curves.items():
        t, distance, kib = zip(*curve, strict=True)
        by_time.plot(t, distance, marker=".", label=name)
        by_bytes.plot(kib, distance, marker=".", label=name)
    for ax, xlabel in ((by_time, "simulated s"), (by_bytes, "KiB sent per node")):
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("relative distance to consensus")
        ax.grid(True, alpha=0.3)
    by_time.legend(fontsize="small")
    fig.suptitle(title)
    fig.savefig(path, format="png")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="16,64", help="swarm sizes, comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="simulated seconds")
    p.add_argument("--task", default="digits")
    p.add_argument("--bandwidth", type=float, default=1.25e6, help="uplink bytes a second")
    p.add_argument("--fanout", type=int, default=2, help="links an epidemic round goes to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gamma", type=float, help="consensus step of every graph (default: int8's)")
    p.add_argument("--plot", type=Path, help="draw the curves into this folder")
    args = p.parse_args()
    torch.set_num_threads(1)
    g = args.gamma
    graphs = [
        ("exponential, --pace node", GossipConfig(codec="int8", gamma=g)),
        ("exponential, --pace link", GossipConfig(codec="int8", pace="link", gamma=g)),
        (
            "one-peer-exponential",
            GossipConfig(codec="int8", topology="one-peer-exponential", pace="link", gamma=g),
        ),
        (
            f"epidemic --fanout {args.fanout}",
            GossipConfig(
                codec="int8", topology="epidemic", fanout=args.fanout, pace="link", gamma=g
            ),
        ),
    ]
    for nodes in (int(n) for n in args.nodes.split(",")):
        print(
            f"\n{nodes} nodes, task {args.task}, uplinks {args.bandwidth:g} B/s, "
            f"{args.duration:g} s simulated"
        )
        print(HEADER)
        curves: dict[str, Curve] = {}
        for name, gossip in graphs:
            print(run(name, gossip, nodes, args, curves), flush=True)
        if args.plot is not None:
            args.plot.mkdir(parents=True, exist_ok=True)
            title = f"{nodes} nodes, {args.task}, uplinks {args.bandwidth * 8 / 1e6:g} Mbit/s"
            plot(curves, args.plot / f"schedules-{nodes}.png", title)


if __name__ == "__main__":
    main()
