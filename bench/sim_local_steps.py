"""Uneven devices on slow links in the simulator: the local steps between rounds adapt by
themselves (many on a fast device, few on a slow one); ``--max-local-steps`` bounds them
(issue 17). Every run in the same invocation, each against the unbounded one.

    python -m bench.sim_local_steps [--nodes 32] [--duration 60] [--bandwidth 20000]
        [--spread 1.0] [--bounds 4,16]

The swarm is ``murmur simulate``'s default (logistic, non-iid shards with alpha 0.5, int8, the
exponential graph, event-triggered rounds), with every node's step time spread log-normally
(``--spread``) and every link ``--bandwidth`` bytes a second. Measured in each run: local
steps per round made (the median node and the most), the share of the run a node was held at
the bound, rounds per node, the final consensus distance, the accuracies, and when the worst
node reached the target.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import torch

from node.config import GossipConfig
from node.sim import SimConfig, Simulation
from node.sim.config import NetConfig

HEADER = (
    "| bound | steps/round median | steps/round max | held share | rounds/node | "
    "consensus dist | final avg | final worst | worst to target s | wall s |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def run_one(base: SimConfig, bound: int | None) -> dict[str, Any]:
    cfg = dataclasses.replace(base, gossip=dataclasses.replace(base.gossip, max_local_steps=bound))
    started = time.perf_counter()
    sim = Simulation(cfg)
    summary = sim.run()
    nodes = list(sim.nodes.values())
    per_round = [n.step / max(n.counters.rounds, 1) for n in nodes]
    trained_s = summary.final.t
    return {
        "bound": bound,
        "median": statistics.median(per_round),
        "max": max(per_round),
        "held": statistics.mean(n.counters.held_s for n in nodes) / max(trained_s, 1e-9),
        "rounds": summary.final.rounds_per_node,
        "consensus": summary.final.consensus_distance,
        "avg": summary.final.avg_accuracy,
        "worst": summary.final.worst_accuracy,
        "worst_s": summary.target_worst_s,
        "wall_s": time.perf_counter() - started,
    }


def row(r: dict[str, Any]) -> str:
    bound = "none" if r["bound"] is None else str(r["bound"])
    worst_s = "—" if r["worst_s"] is None else f"{r['worst_s']:.1f}"
    return (
        f"| {bound} | {r['median']:.1f} | {r['max']:.1f} | {r['held']:.0%} | {r['rounds']:.0f} | "
        f"{r['consensus']:.3g} | {r['avg']:.3f} | {r['worst']:.3f} | {worst_s} | "
        f"{r['wall_s']:.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--bandwidth", type=float, default=20_000.0, help="bytes a second a link")
    p.add_argument("--spread", type=float, default=1.0, help="log-normal spread of step times")
    p.add_argument("--bounds", default="4,16", help="the bounds to try, beside none")
    args = p.parse_args()
    torch.set_num_threads(1)
    base = SimConfig(
        nodes=args.nodes,
        duration_s=args.duration,
        speed_spread=args.spread,
        net=NetConfig(bandwidth_bps=args.bandwidth),
        gossip=GossipConfig(codec="int8"),
    )
    print(HEADER, flush=True)
    for bound in [None, *(int(b) for b in args.bounds.split(","))]:
        print(row(run_one(base, bound)), flush=True)


if __name__ == "__main__":
    main()
