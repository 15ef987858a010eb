"""What a codec costs a training swarm per round, when compute sets the pace (issue 17's auto).

    python -m bench.codec_tracking [--nodes 16] [--task digits] [--target 0.9] [--duration 4]

``--compress auto`` weighs each codec by the rounds it needs times a round's time on the link
(gossip/codec_choice.py). How many rounds a codec needs depends on what the swarm does. From
far apart, pure gossip (bench/codec_gamma.py) needs 5 rounds of fp16 and 345 of sign to agree
10,000-fold. A training swarm starts from one model (a joiner pulls it) and only has to keep up
with its own steps, which is a much easier job for a small codec: each round's error waits in
x - x̂ for the next.

Each codec runs ``murmur simulate``'s swarm (the daemon's own nodes on simulated time): the
same starting model, non-iid shards, a local step every 20 ms, links so fast (1 GB/s, 1-2 ms)
that every codec makes a round after every step. So every codec gets the same rounds, and the
table shows what a round of each is worth: the simulated seconds until the worst node reached
the target (sampled every 0.1 s), that time over fp16's, and the relative consensus distance
(median over the second half of the run) over fp16's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation

CODECS = ("fp16", "int8", "int4", "sign")


def run(codec: str, args: argparse.Namespace) -> tuple[float | None, float, float]:
    """(worst node's time to target, median relative distance of the second half, wall s)."""
    torch.set_num_threads(1)
    cfg = SimConfig(
        nodes=args.nodes,
        task=args.task,
        seed=args.seed,
        duration_s=args.duration,
        eval_every_s=0.1,
        target_accuracy=args.target,
        step_time_s=0.02,
        gossip=GossipConfig(codec=codec),
        net=NetConfig(latency_s=(0.001, 0.002), bandwidth_bps=1e9),
    )
    began = time.perf_counter()
    distances: list[tuple[float, float]] = []
    summary = Simulation(cfg).run(lambda s: distances.append((s.t, s.relative_distance)))
    late = [d for t, d in distances if t >= args.duration / 2]
    return summary.target_worst_s, statistics.median(late), time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--task", default="digits")
    p.add_argument("--target", type=float, default=0.9, help="target accuracy")
    p.add_argument("--duration", type=float, default=4.0, help="simulated seconds")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    results = {codec: run(codec, args) for codec in CODECS}
    base_t, base_d, _ = results["fp16"]
    print(f"{args.nodes} nodes, {args.task}, target {args.target}")
    print("| codec | worst to target s | vs fp16 | rel. distance | vs fp16 | wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    for codec, (t, d, wall) in results.items():
        ratio = "-" if t is None or base_t is None else f"{t / base_t:.2f}"
        shown = "-" if t is None else f"{t:.1f}"
        print(f"| {codec} | {shown} | {ratio} | {d:.2g} | {d / base_d:.1f} | {wall:.0f} |")


if __name__ == "__main__":
    main()
