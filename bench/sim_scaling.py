"""How the swarm and the simulator scale with N: ring, static exponential, random 4-regular.

    python -m bench.sim_scaling [--sizes 16 64 256 1024] [--topologies ring exponential
        random-regular] [--duration 10]

Every run: ``murmur simulate``'s Simulation on the logistic task, Dirichlet(0.5) shards, int8,
one round per local step at most (H = 1), 0.1 simulated seconds per step, links of 10-50 ms
one way and 10 Mbit/s uplinks, no loss, no churn, and every node starting from a model of its
own (``independent_init``), so that consensus starts far and the time it takes shows. Each run
is a child process of its own, for clean memory figures.

Measured: the simulated time (and the mean rounds per node by then) until the relative
consensus distance (1/n) Σ ||x_i - x̄||² / ||x̄||² first falls to 0.01, and until the averaged
model and the worst node reach 80% accuracy; the relative distance after the last sample;
gossip bytes sent per node (deltas and snapshots, as the daemon counts them) and per round; the
simulator's wall time per simulated node-second, and its resident memory per simulated node
(RSS growth while the swarm is built, over N) beside the tensors a node keeps.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from bench.sim_common import first_at_or_below, fmt_s, rounds_to, run_child, run_here
from gossip.topology import build, mixing_matrix, spectral_gap
from node.config import GossipConfig
from node.sim import NetConfig, SimConfig

THRESHOLD = 1e-2
TARGET = 0.8


def config(n: int, topology: str, duration_s: float, gossip_only: bool = False) -> SimConfig:
    return SimConfig(
        nodes=n,
        task="logistic",
        alpha=0.5,
        seed=0,
        independent_init=True,
        step_time_s=0.1,
        # Gossip alone: no training, a round every 0.1 s (a node whose budget is spent).
        steps=0 if gossip_only else None,
        duration_s=duration_s,
        eval_every_s=0.2 if gossip_only else 0.5,
        consensus_threshold=THRESHOLD,
        target_accuracy=TARGET,
        gossip=GossipConfig(topology=topology, degree=4, codec="int8", idle_round_interval_s=0.1),
        net=NetConfig(latency_s=(0.01, 0.05), bandwidth_bps=1.25e6),
    )


def row(n: int, topology: str, r: dict[str, Any]) -> str:
    samples = r["samples"]
    s = r["summary"]
    last = samples[-1]
    consensus = first_at_or_below(samples, "relative_distance", THRESHOLD)
    avg = next((x for x in samples if x["t"] > 0 and x["avg_accuracy"] >= TARGET), None)
    worst = next((x for x in samples if x["t"] > 0 and x["worst_accuracy"] >= TARGET), None)
    node_s = n * last["t"]
    return (
        f"| {topology} | {n} | {fmt_s(consensus)} | {last['relative_distance']:.2g} | "
        f"{fmt_s(avg)} | {fmt_s(worst)} | {last['worst_accuracy']:.3f} | "
        f"{s['bytes_per_node'] / 2**20:.2f} | {s['bytes_per_node_per_round']:.0f} | "
        f"{r['wall_s']:.0f} | {1e3 * r['wall_s'] / node_s:.1f} | "
        f"{r['rss_per_node'] / 1024:.0f} | {s['tensor_bytes_per_node'] / 1024:.1f} |"
    )


def gossip_row(n: int, topology: str, r: dict[str, Any]) -> str:
    samples = r["samples"]

    def rounds(factor: float) -> str:
        got = rounds_to(samples, factor)
        return "—" if got is None else f"{got:.0f}"

    last = samples[-1]
    cd0 = next(x["consensus_distance"] for x in samples if math.isfinite(x["consensus_distance"]))
    # Exact synchronous gossip shrinks the distance by (1 - gap)^2 a round at least; the same
    # graph as the simulator's, up to labels (random-regular: another draw of the same kind).
    graph = build(topology, [f"{i:05d}" for i in range(n)], degree=4, seed=0)
    bound = math.log(100) / (2 * spectral_gap(mixing_matrix(graph)))
    return (
        f"| {topology} | {n} | {rounds(1e2)} | {bound:.0f} | {rounds(1e4)} | "
        f"{last['consensus_distance'] / cd0:.2g} | {last['rounds_per_node']:.0f} | "
        f"{r['wall_s']:.0f} |"
    )


GOSSIP_HEADER = (
    "| topology | N | rounds to CD/100 | ln(100) / 2·gap | rounds to CD/10⁴ | "
    "CD end / CD start | rounds | wall s |\n|---|---:|---:|---:|---:|---:|---:|---:|"
)

HEADER = (
    "| topology | N | consensus ≤ 0.01: s (rounds) | rel. distance at end | "
    "avg ≥ 0.8: s (rounds) | worst ≥ 0.8: s (rounds) | worst acc at end | MiB sent / node | "
    "B / node / round | wall s | wall ms / node·s | RSS KiB / node | tensor KiB / node |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    p.add_argument("--topologies", nargs="+", default=["ring", "exponential", "random-regular"])
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--gossip-only", action="store_true", help="no training: mixing alone")
    p.add_argument("--one", nargs="+", metavar="N TOPOLOGY DURATION [GOSSIP_ONLY]")
    p.add_argument("--out", help="also write every run's result as JSON lines here")
    args = p.parse_args()
    if args.one:
        n, topology, duration = int(args.one[0]), args.one[1], float(args.one[2])
        print(json.dumps(run_here(config(n, topology, duration, args.one[3:] == ["1"]))))
        return
    started = time.perf_counter()
    print(GOSSIP_HEADER if args.gossip_only else HEADER, flush=True)
    for n in args.sizes:
        for topology in args.topologies:
            r = run_child(
                "bench.sim_scaling",
                [str(n), topology, str(args.duration), "1" if args.gossip_only else "0"],
            )
            print((gossip_row if args.gossip_only else row)(n, topology, r), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"n": n, "topology": topology, **r}) + "\n")
    print(f"\ntotal wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
