"""A partition at N = 256 in the simulator: split in halves for 30 s, then healed.

    python -m bench.sim_partition [--nodes 256] [--at 30] [--for 30] [--groups 2] [--after 60]
        [--seed 0]

One run of ``murmur simulate``'s ``Simulation`` with ``--partition AT:FOR:GROUPS``: the logistic
task, Dirichlet(0.5) shards, int8, random 4-regular graphs (the exponential graph's 16
neighbours at N = 256 cost four times the simulator's time), one local step per 0.1 simulated
seconds, links of 10-50 ms one way and 10 Mbit/s uplinks, no loss, default ``SwimConfig``.
Between the groups, deltas and membership messages are lost and calls wait until the end.

Measured, in simulated seconds after the split ends: when every training node's view is exactly
the live nodes again (checked every 0.5 s), when the consensus distance is back under its value
at the split, and when every node's own accuracy is back at or above what it was at the split,
less ``--tolerance`` (both checked every 2 s); the consensus distance and the accuracies
(averaged model, worst node) at the split, at its end and at the end of the run. The same
figures for a control run of the same swarm whose network never splits show how much of it is
SGD's own noise (the logistic task has converged by the split).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace

import torch

from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation
from node.sim.config import PartitionConfig
from node.sim.node import CPU
from node.sim.swarm import Sample
from node.tasks.base import evaluate


def config(n: int, split: PartitionConfig, after_s: float, seed: int) -> SimConfig:
    return SimConfig(
        nodes=n,
        task="logistic",
        alpha=0.5,
        seed=seed,
        step_time_s=0.1,
        duration_s=split.at_s + split.for_s + after_s,
        eval_every_s=2.0,
        gossip=GossipConfig(topology="random-regular", degree=4, codec="int8"),
        net=NetConfig(latency_s=(0.01, 0.05), bandwidth_bps=1.25e6, partition=split),
    )


def accuracies(sim: Simulation) -> dict[str, float]:
    return {
        n.node_id: evaluate(n.task.model, n.task.eval, n.task.loss, CPU)[1]
        for n in sim.nodes.values()
        if n.training
    }


@dataclass(frozen=True)
class Run:
    one_view_s: float | None
    consensus_s: float | None
    accuracy_s: float | None
    samples: tuple[tuple[str, Sample], ...]
    worst_drop: float
    wall_s: float


def run(cfg: SimConfig, split: PartitionConfig, tolerance: float) -> Run:
    """One run; times are simulated seconds after ``split`` ends (it may be a control run whose
    network never splits, measured at the same moments)."""
    t0 = time.perf_counter()
    sim = Simulation(cfg)
    end = split.at_s + split.for_s
    sim.events.run_until(split.at_s)
    before, acc_before = sim.sample(), accuracies(sim)
    sim.events.run_until(end)
    during = sim.sample()
    times: dict[str, float | None] = {"one view": None, "consensus": None, "accuracy": None}
    t = end
    while t < cfg.duration_s:
        t += 0.5
        sim.events.run_until(t)
        if times["one view"] is None and sim.partial_views() == 0:
            times["one view"] = t - end
        if round(2 * t) % 4 == 0:  # every 2 s
            s = sim.sample()
            if times["consensus"] is None and s.consensus_distance <= before.consensus_distance:
                times["consensus"] = t - end
            if times["accuracy"] is None:
                acc = accuracies(sim)
                if all(acc[i] >= a - tolerance for i, a in acc_before.items() if i in acc):
                    times["accuracy"] = t - end
    final, acc_final = sim.sample(), accuracies(sim)
    drop = max(acc_before[i] - a for i, a in acc_final.items() if i in acc_before)
    return Run(
        times["one view"],
        times["consensus"],
        times["accuracy"],
        (("split starts", before), ("split ends", during), ("end of run", final)),
        drop,
        time.perf_counter() - t0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--at", type=float, default=30.0, help="simulated s before the split")
    parser.add_argument("--for", dest="for_s", type=float, default=30.0, help="its length")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--after", type=float, default=60.0, help="simulated s after it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tolerance", type=float, default=0.01, help="accuracy counted as back (SGD noise)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    split = PartitionConfig(args.at, args.for_s, args.groups)
    cfg = config(args.nodes, split, args.after, args.seed)
    runs = {
        "split": run(cfg, split, args.tolerance),
        "control (no split)": run(
            replace(cfg, net=replace(cfg.net, partition=None)), split, args.tolerance
        ),
    }

    def when(x: float | None) -> str:
        return "not within the run" if x is None else f"{x:.1f}"

    wall = sum(r.wall_s for r in runs.values())
    print(
        f"# {args.nodes} nodes split into {args.groups} at {split.at_s:g} s for "
        f"{split.for_s:g} s, {args.after:g} s after; seed {args.seed}; {wall:.0f} s wall"
    )
    print()
    print(
        "| run | one view again, s after | consensus ≤ its value at the split, s after | "
        f"every node ≥ its accuracy at the split − {args.tolerance:g}, s after | "
        "largest drop of a node's accuracy, split to end |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, r in runs.items():
        print(
            f"| {name} | {when(r.one_view_s)} | {when(r.consensus_s)} | "
            f"{when(r.accuracy_s)} | {r.worst_drop:.3f} |"
        )
    print()
    print("| run | moment | t s | partial views | consensus distance | avg acc | worst acc |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, r in runs.items():
        for moment, sample in r.samples:
            print(
                f"| {name} | {moment} | {sample.t:.0f} | {sample.partial_views} | "
                f"{sample.consensus_distance:.3g} | {sample.avg_accuracy:.3f} | "
                f"{sample.worst_accuracy:.3f} |"
            )


if __name__ == "__main__":
    main()
