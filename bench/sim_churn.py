"""Time to target under churn: N = 256, 0%, 1% and 5% of the nodes replaced per simulated minute.

    python -m bench.sim_churn [--nodes 256] [--rates 0 0.01 0.05] [--duration 40] [--seeds 1]
        [--first-seed 0] [--topology random-regular] [--degree 4]

Every run: the logistic task, Dirichlet(0.5) shards, int8, random 4-regular graphs unless
``--topology`` says otherwise (the exponential graph's 15 neighbours at N = 256 cost four
times the simulator's time), one local
step per 0.25 simulated seconds and at most one round per step, links of 10-50 ms one way and
10 Mbit/s uplinks, every node starting from the swarm's common model (as the daemon does).
Churn replaces nodes at the given rate: half of the departures announce themselves (SWIM's
LEFT), half crash silently; as many nodes join, each through a random live member, pulling the
model from a neighbour and taking the shard of a node that went.

Measured: when the averaged model and the worst node first reach 80% accuracy; the share of
the later samples in which the worst node is still at or above it; the worst node's accuracy
and the relative consensus distance averaged over the second half of the run; rounds per local
step (a crashed neighbour keeps a node's link busy until membership declares it dead, and the
node makes no round meanwhile); gossip bytes per node, and how many of them were snapshots (a
whole model, the first message of every new link: what a graph that moves many links at each
change of the members costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from bench.sim_common import run_child, run_here
from node.config import GossipConfig
from node.sim import ChurnConfig, NetConfig, SimConfig

TARGET = 0.8


def config(
    n: int,
    rate: float,
    duration_s: float,
    seed: int,
    topology: str = "random-regular",
    degree: int = 4,
) -> SimConfig:
    return SimConfig(
        nodes=n,
        task="logistic",
        alpha=0.5,
        seed=seed,
        step_time_s=0.25,
        duration_s=duration_s,
        eval_every_s=2.0,
        target_accuracy=TARGET,
        gossip=GossipConfig(topology=topology, degree=degree, codec="int8"),
        net=NetConfig(latency_s=(0.01, 0.05), bandwidth_bps=1.25e6),
        churn=ChurnConfig.replacing(rate),
    )


HEADER = (
    "| replaced / min | seed | joins / departures | avg ≥ 0.8 s | worst ≥ 0.8 s | "
    "worst ≥ 0.8 after (share of samples) | worst acc, 2nd half | rel. distance, 2nd half | "
    "rounds / step | MiB sent / node | snapshots / node (share of bytes) | wall s |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def row(rate: float, seed: int, r: dict[str, Any]) -> str:
    samples = r["samples"]
    last = samples[-1]
    half = [s for s in samples if s["t"] >= last["t"] / 2]
    avg = next((s for s in samples if s["t"] > 0 and s["avg_accuracy"] >= TARGET), None)
    worst = next((s for s in samples if s["t"] > 0 and s["worst_accuracy"] >= TARGET), None)
    after = [s for s in samples if worst is not None and s["t"] >= worst["t"]]
    kept = sum(s["worst_accuracy"] >= TARGET for s in after) / len(after) if after else 0.0
    return (
        f"| {100 * rate:g}% | {seed} | {last['joined']} / {last['departed']} | "
        f"{avg['t'] if avg else '—'} | {worst['t'] if worst else '—'} | {kept:.2f} | "
        f"{statistics.mean(s['worst_accuracy'] for s in half):.3f} | "
        f"{statistics.mean(s['relative_distance'] for s in half):.2g} | "
        f"{last['rounds_per_node'] / max(last['steps_per_node'], 1):.2f} | "
        f"{last['bytes_per_node'] / 2**20:.2f} | "
        f"{last['snapshots_per_node']:.1f} "
        f"({last['snapshot_bytes_per_node'] / max(last['bytes_per_node'], 1):.0%}) | "
        f"{r['wall_s']:.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.01, 0.05])
    p.add_argument("--duration", type=float, default=40.0)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--topology", default="random-regular")
    p.add_argument("--degree", type=int, default=4)
    p.add_argument("--one", nargs=6, metavar=("N", "RATE", "DURATION", "SEED", "TOPOLOGY", "K"))
    p.add_argument("--out", help="also write every run's result as JSON lines here")
    args = p.parse_args()
    if args.one:
        n, rate, duration, seed, topology, degree = args.one
        cfg = config(int(n), float(rate), float(duration), int(seed), topology, int(degree))
        print(json.dumps(run_here(cfg)))
        return
    started = time.perf_counter()
    print(HEADER, flush=True)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for rate in args.rates:
            r = run_child(
                "bench.sim_churn",
                [
                    str(a)
                    for a in (args.nodes, rate, args.duration, seed, args.topology, args.degree)
                ],
            )
            print(row(rate, seed, r), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"rate": rate, "seed": seed, **r}) + "\n")
    print(f"\ntotal wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
