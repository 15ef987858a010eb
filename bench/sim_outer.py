"""The DiLoCo-style outer step against none, at several local step counts, in the simulator
(issue 19). Every run in the same invocation, each against the run without the outer step at the
same H.

    python -m bench.sim_outer [--nodes 64] [--duration 30] [--hs 1,10,50] [--outer-lr 0.7]
        [--outer-momentum 0.9] [--bandwidth 125000]

The swarm is ``murmur simulate``'s default (logistic, non-iid shards with alpha 0.5, int8, the
exponential graph, event-triggered rounds) with every link ``--bandwidth`` bytes a second. At
each H (``--local-steps H --max-local-steps H``: a round after exactly H steps, whatever the
links) it runs once without the outer step and once with ``--outer-lr`` and
``--outer-momentum``, the daemon's outer Nesterov step on each round's change (the same
``OuterNesterov`` the daemon uses). Measured: rounds and bytes per node, the final consensus
distance, the averaged model's and the worst node's accuracy, when the worst node reached the
target, and the bytes a node had sent by then.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import torch

from node.config import GossipConfig
from node.sim import SimConfig, Simulation
from node.sim.config import NetConfig

HEADER = (
    "| H | outer lr | rounds/node | KiB/node | consensus dist | final avg | final worst | "
    "worst to target s | KiB/node by then | wall s |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def run_one(base: SimConfig, h: int, outer_lr: float | None, momentum: float) -> dict[str, Any]:
    gossip = dataclasses.replace(
        base.gossip,
        local_steps=h,
        max_local_steps=h,
        outer_lr=outer_lr,
        outer_momentum=momentum,
    )
    started = time.perf_counter()
    sim = Simulation(dataclasses.replace(base, gossip=gossip))
    summary = sim.run()
    final = summary.final
    worst_s = summary.target_worst_s
    by_then = None
    if worst_s is not None:  # the bytes a node had sent when the worst node got there
        by_then = next(s.bytes_per_node for s in sim.samples if s.t >= worst_s)
    return {
        "h": h,
        "outer_lr": outer_lr,
        "rounds": final.rounds_per_node,
        "bytes": final.bytes_per_node,
        "consensus": final.consensus_distance,
        "avg": final.avg_accuracy,
        "worst": final.worst_accuracy,
        "worst_s": worst_s,
        "by_then": by_then,
        "wall_s": time.perf_counter() - started,
    }


def row(r: dict[str, Any]) -> str:
    lr = "none" if r["outer_lr"] is None else f"{r['outer_lr']:g}"
    worst_s = "—" if r["worst_s"] is None else f"{r['worst_s']:.1f}"
    by_then = "—" if r["by_then"] is None else f"{r['by_then'] / 1024:.0f}"
    return (
        f"| {r['h']} | {lr} | {r['rounds']:.0f} | {r['bytes'] / 1024:.0f} | "
        f"{r['consensus']:.3g} | {r['avg']:.3f} | {r['worst']:.3f} | {worst_s} | {by_then} | "
        f"{r['wall_s']:.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--hs", default="1,10,50", help="local steps between rounds to try")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--bandwidth", type=float, default=125_000.0, help="bytes a second a link")
    args = p.parse_args()
    torch.set_num_threads(1)
    base = SimConfig(
        nodes=args.nodes,
        duration_s=args.duration,
        net=NetConfig(bandwidth_bps=args.bandwidth),
        gossip=GossipConfig(codec="int8"),
    )
    print(HEADER, flush=True)
    for h in (int(x) for x in args.hs.split(",")):
        for outer_lr in (None, args.outer_lr):
            print(row(run_one(base, h, outer_lr, args.outer_momentum)), flush=True)


if __name__ == "__main__":
    main()
