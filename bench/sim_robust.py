"""Robust mixing where honest nodes are out of step: how often an honest neighbour is evicted,
and whether every attacker still is, in the simulator.

    python -m bench.sim_robust [--seed 0] [--jobs 2] [--only NAME,...]

Each row is one simulated swarm with ``--robust`` (int8, logistic, non-iid shards); the clean
rows have no attacker and nodes out of step in one of three ways: every node's step time drawn
over a spread of e (``speed_spread`` 1), a quarter of the nodes five times slower, or 30% of
them paused at any time (8 s on average). The attack rows put two attackers among 16 nodes
whose step times are spread the same way. Evictions are the honest nodes' anomaly scores'
evictions over the run (``evicted_honest``, ``evicted_attackers`` of the last sample); the
simulator is deterministic for a seed, so the parent commit run with the same command gives
the before.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch

from gossip.robust import ATTACKS
from node.config import GossipConfig
from node.sim import SimConfig, Simulation

CLEAN: dict[str, dict[str, Any]] = {
    "speeds spread": {"speed_spread": 1.0, "steps": 1000},
    "a quarter 5x slower": {"stragglers": 0.25, "straggler_slowdown": 5.0, "steps": 1000},
    "30% paused": {"paused_fraction": 0.3, "pause_mean_s": 8.0},
}


def config(name: str, seed: int) -> SimConfig:
    if name in CLEAN:
        gossip = GossipConfig(codec="int8", robust=True)
        return SimConfig(nodes=32, duration_s=40, seed=seed, gossip=gossip, **CLEAN[name])
    gossip = GossipConfig(codec="int8", robust=True, attack=name)
    return SimConfig(
        nodes=16,
        duration_s=30,
        seed=seed,
        gossip=gossip,
        attackers=0.125,
        speed_spread=1.0,
        steps=1000,
    )


def run(name: str, seed: int) -> str:
    torch.set_num_threads(1)
    final = Simulation(config(name, seed)).run().final
    row = f"`{name}`, 2 of 16, speeds spread" if name in ATTACKS else f"clean, {name}"
    return (
        f"| {row} | {final.evicted_honest} | {final.evicted_attackers} "
        f"| {final.worst_accuracy:.3f} | {final.mean_accuracy:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", help="rows by name: the clean rows' keys or attacks")
    args = parser.parse_args()
    names = [*CLEAN, *ATTACKS]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run, names, [args.seed] * len(names)))
    print("| swarm | honest evictions | attacker evictions | worst accuracy | mean accuracy |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
