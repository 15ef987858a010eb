"""How long small deltas may wait in line on a link: the worst node at the end of training against
``--link-window-s`` (gossip/outbox.py ``window_s``), on uplinks of several rates, in the simulator.

    .venv/bin/python -m bench.sim_window
    .venv/bin/python -m bench.sim_window --bandwidths 3e4 --codecs sign --windows inf,0.5 --seeds 1

Eight nodes of the digits MLP train 1,000 steps of 20 ms (simulated time, so the machine's load
does not matter); each row is the mean over ``--seeds`` swarms (seed 0, 1, ...), with each seed's
worst node in brackets. ``inf``: only the counts and ``window_bytes`` bound the line, as before
``window_s`` existed.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics

import torch

from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation
from node.sim.sampling import Sample


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def end_of_training(bandwidth: float, codec: str, window_s: float, seed: int, steps: int) -> Sample:
    cfg = SimConfig(
        nodes=8,
        task="digits",
        steps=steps,
        step_time_s=0.02,
        duration_s=steps * 0.02 + 0.01,
        eval_every_s=0.5,
        seed=seed,
        gossip=GossipConfig(codec=codec, link_window_s=window_s),
        net=NetConfig(bandwidth_bps=bandwidth),
    )
    sim = Simulation(cfg)
    sim.run()
    return [s for s in sim.samples if s.t <= steps * 0.02 + 1e-9][-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bandwidths", type=floats, default=[1e4, 3e4, 1.25e5, 1.25e6])
    parser.add_argument("--codecs", default="auto,sign")
    parser.add_argument("--windows", type=floats, default=[math.inf, 0.5, 1.0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| uplink B/s | codec | window_s | worst node (each seed) | distance | rounds per node |")
    print("|---:|---|---:|---|---:|---:|")
    for bandwidth, codec, window_s in itertools.product(
        args.bandwidths, args.codecs.split(","), args.windows
    ):
        ends = [
            end_of_training(bandwidth, codec, window_s, s, args.steps) for s in range(args.seeds)
        ]
        worst = [e.worst_accuracy for e in ends]
        print(
            f"| {bandwidth:g} | {codec} | {window_s:g} | {statistics.mean(worst):.3f} "
            f"({', '.join(f'{w:.3f}' for w in worst)}) "
            f"| {statistics.mean(e.relative_distance for e in ends):.2g} "
            f"| {statistics.mean(e.rounds_per_node for e in ends):.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
