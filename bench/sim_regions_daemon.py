"""Regions in the daemon's simulator: ``--topology regional`` against the flat exponential graph
when the links between regions are slower (issue 19).

    python -m bench.sim_regions_daemon [--nodes 64] [--regions 4] [--slowdown 10]
        [--bridges 1,2,4] [--duration 40] [--task logistic] [--per-link]
        [--bridged sign/10,int8/3]

With ``--per-link`` the flat and each regional graph run again with a copy per link
(``--pace link``), and each regional graph once more for each CODEC/P of ``--bridged``, its
bridges sending CODEC in one round of P (``--bridge-compress CODEC --bridge-period P``).

Each run is ``murmur simulate --regions R --cross-region-slowdown X`` with the topology named:
the daemon's own nodes (codecs, replicas, mixing, SWIM, link policy, trainer step) on simulated
time, each node starting from a model of its own so that consensus starts far. A message
between regions takes X times the delay and X times the uplink time. The table gives, for each
graph, the links across regions, the seconds to consensus (relative distance 1e-2) and the
relative distance at the end, the seconds to the target (the averaged model, and the worst
node), the bytes a node sent in all and the share of them that crossed regions, the rounds a
node made, and the last sample's worst accuracy.

bench/sim_regions.py measures the same question in the lock-step core, where a link may also
keep its own pace; here every node makes one delta for all its links, as the daemon does.
"""

from __future__ import annotations

import argparse
import time

import torch

from gossip.topology import crosses
from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation

HEADER = (
    "| graph | links across | consensus s | final rel. distance | target s (avg / worst) "
    "| KiB/node | across % | rounds/node | worst acc | wall s |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def run(name: str, gossip: GossipConfig, args: argparse.Namespace) -> str:
    cfg = SimConfig(
        nodes=args.nodes,
        task=args.task,
        seed=args.seed,
        independent_init=True,
        duration_s=args.duration,
        eval_every_s=1.0,
        gossip=gossip,
        net=NetConfig(regions=args.regions, cross_region_slowdown=args.slowdown),
    )
    began = time.perf_counter()
    sim = Simulation(cfg)
    summary = sim.run()
    nodes = list(sim.nodes.values())
    region_of = {n.node_id: n.swim.region for n in nodes}
    links = {frozenset((n.node_id, j)) for n in nodes for j in n.links}
    across = sum(crosses(region_of, *e) for e in links)
    sent = sum(link.stats.bytes_sent for n in nodes for link in n.links.values())
    sent_across = sum(
        link.stats.bytes_sent
        for n in nodes
        for j, link in n.links.items()
        if crosses(region_of, n.node_id, j)
    )
    return (
        f"| {name} | {across} | {_fmt(summary.consensus_s)} | "
        f"{summary.final.relative_distance:.2g} | "
        f"{_fmt(summary.target_avg_s)} / {_fmt(summary.target_worst_s)} | "
        f"{summary.bytes_per_node / 1024:.0f} | {100 * sent_across / max(sent, 1):.1f} | "
        f"{summary.final.rounds_per_node:.0f} | "
        f"{summary.final.worst_accuracy:.3f} | {time.perf_counter() - began:.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--slowdown", type=float, default=10.0)
    p.add_argument("--bridges", default="1,2,4", help="bridges between each two regions")
    p.add_argument("--duration", type=float, default=40.0, help="simulated seconds")
    p.add_argument("--task", default="logistic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-link", action="store_true", help="also with --pace link")
    p.add_argument("--bridged", default="sign/10,int8/3", help="bridge CODEC/PERIOD pairs")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(
        f"{args.nodes} nodes, {args.regions} regions, links across {args.slowdown:g}x slower, "
        f"task {args.task}, {args.duration:g} s simulated"
    )
    print(HEADER)
    print(
        run("flat exponential", GossipConfig(codec="int8", topology="exponential"), args),
        flush=True,
    )
    if args.per_link:
        flat = GossipConfig(codec="int8", topology="exponential", pace="link")
        print(run("flat exponential, --pace link", flat, args), flush=True)
    for k in (int(b) for b in args.bridges.split(",")):
        gossip = GossipConfig(codec="int8", topology="regional", degree=k)
        print(run(f"regional, {k} bridge(s) per pair", gossip, args), flush=True)
        if not args.per_link:
            continue
        per_link = GossipConfig(codec="int8", topology="regional", degree=k, pace="link")
        print(run(f"regional, {k} bridge(s), --pace link", per_link, args), flush=True)
        for pair in args.bridged.split(","):
            codec, _, period = pair.partition("/")
            bridged = GossipConfig(
                topology="regional",
                degree=k,
                pace="link",
                bridge_codec=codec,
                bridge_period=int(period),
            )
            name = f"regional, {k} bridge(s), {codec} 1 round in {period} across"
            print(run(name, bridged, args), flush=True)


if __name__ == "__main__":
    main()
