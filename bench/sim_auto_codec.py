"""``--compress auto`` in the daemon's simulator against each codec chosen by hand for all
links, on a mix of links (issue 17).

    python -m bench.sim_auto_codec [--nodes 16] [--regions 4] [--slowdown 100]
        [--bandwidth 1.25e7] [--duration 20] [--task digits]

Each run is ``murmur simulate --topology regional --pace link`` with the codec named: the
daemon's own nodes (link machine and meter, codec choice, replicas, mixing, SWIM, trainer step)
on simulated time, each starting from a model of its own so that consensus starts far. Inside a
region a link is fast (``--bandwidth`` bytes a second from each uplink, 1-2 ms): compute sets
the pace there. Between regions it is ``--slowdown`` times slower, in delay and uplink time:
bytes set the pace. The table: seconds to consensus (relative distance 1e-2) and the relative
distance at the end, seconds to the target (averaged model, worst node), KiB a node sent, the
rounds a node made, and for ``auto`` the codecs its links ended on, inside and across regions.
A node's uplink sends its messages one after another; a slower path across regions is a pipe
of its own behind it (gossip/events.py), so a delta across regions holds up only the deltas
behind it on that path, as on a real network.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from gossip.topology import crosses
from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation

HEADER = (
    "| codec | consensus s | final rel. distance | target s (avg / worst) | KiB/node "
    "| rounds/node | codecs inside / across | wall s |\n"
    "|---|---:|---:|---:|---:|---:|---|---:|"
)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"


def run(codec: str, args: argparse.Namespace) -> str:
    cfg = SimConfig(
        nodes=args.nodes,
        task=args.task,
        seed=args.seed,
        independent_init=True,
        duration_s=args.duration,
        eval_every_s=0.5,
        target_accuracy=args.target,
        gossip=GossipConfig(topology="regional", degree=args.bridges, codec=codec, pace="link"),
        net=NetConfig(
            latency_s=(0.001, 0.002),
            bandwidth_bps=args.bandwidth,
            regions=args.regions,
            cross_region_slowdown=args.slowdown,
        ),
    )
    began = time.perf_counter()
    sim = Simulation(cfg)
    summary = sim.run()
    nodes = list(sim.nodes.values())
    region_of = {n.node_id: n.swim.region for n in nodes}
    picks: dict[bool, Counter[str]] = {False: Counter(), True: Counter()}
    for n in nodes:
        for peer in n.state.copies:
            picks[crosses(region_of, n.node_id, peer)][n.state.codec_for(peer).name] += 1
    return (
        f"| {codec} | {_fmt(summary.consensus_s)} | {summary.final.relative_distance:.2g} | "
        f"{_fmt(summary.target_avg_s)} / {_fmt(summary.target_worst_s)} | "
        f"{summary.bytes_per_node / 1024:.0f} | {summary.final.rounds_per_node:.0f} | "
        f"{_counts(picks[False])} / {_counts(picks[True])} | "
        f"{time.perf_counter() - began:.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--bridges", type=int, default=2, help="links between each two regions")
    p.add_argument("--slowdown", type=float, default=100.0)
    p.add_argument("--bandwidth", type=float, default=1.25e7, help="uplink bytes a second")
    p.add_argument("--duration", type=float, default=20.0, help="simulated seconds")
    p.add_argument("--task", default="digits")
    p.add_argument("--target", type=float, default=0.95, help="target accuracy")
    p.add_argument("--codecs", default="fp16,int8,int4,auto")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(
        f"{args.nodes} nodes, {args.regions} regions, {args.bridges} links between each two, "
        f"uplinks {args.bandwidth:g} B/s, across {args.slowdown:g}x slower, task {args.task}, "
        f"{args.duration:g} s simulated"
    )
    print(HEADER)
    for codec in args.codecs.split(","):
        print(run(codec, args), flush=True)


if __name__ == "__main__":
    main()
