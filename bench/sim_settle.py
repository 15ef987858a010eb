"""After training: how soon a swarm's models agree and what its rounds cost until they fall quiet.

    .venv/bin/python -m bench.sim_settle [--codec auto] [--nodes 8] [--bandwidth 1.25e6]
        [--task digits] [--steps 300] [--step-time 0.02] [--after 75]

The daemon's simulator (node/sim), the defaults otherwise (event-triggered rounds, idle rounds
after training, the exponential graph): ``--nodes`` nodes train ``--steps`` steps of
``--step-time`` on non-iid shards, every uplink carrying ``--bandwidth`` bytes a second; then the
run goes on ``--after`` seconds. Printed: at the end of training, the relative consensus
distance and the worst node's accuracy; then, at 1, 5, 15 and ``--after`` seconds after it, the
distance, the bytes and the rounds per node since training ended.
"""

from __future__ import annotations

import argparse

from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation

MARKS_S = (1.0, 5.0, 15.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--codec", default="auto")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--bandwidth", type=float, default=1.25e6, help="bytes a second")
    parser.add_argument("--task", default="digits")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--after", type=float, default=75.0)
    args = parser.parse_args()
    trained_s = args.steps * args.step_time
    cfg = SimConfig(
        nodes=args.nodes,
        task=args.task,
        steps=args.steps,
        step_time_s=args.step_time,
        duration_s=trained_s + args.after,
        eval_every_s=0.5,
        gossip=GossipConfig(codec=args.codec),
        net=NetConfig(bandwidth_bps=args.bandwidth),
    )
    sim = Simulation(cfg)
    sim.run()
    at = {round(s.t, 6): s for s in sim.samples}
    end = at[round(trained_s, 6)]
    print(
        f"{args.codec}, {args.nodes} nodes of {args.task}, uplinks {args.bandwidth:g} B/s: "
        f"at the end of training relative distance {end.relative_distance:.2g}, "
        f"worst node {end.worst_accuracy:.3f}"
    )
    print("| after training | relative distance | KB per node since | rounds per node since |")
    print("|---:|---:|---:|---:|")
    for mark in (*MARKS_S, args.after):
        s = at[round(trained_s + mark, 6)]
        sent_kb = (s.bytes_per_node - end.bytes_per_node) / 1e3
        rounds = s.rounds_per_node - end.rounds_per_node
        print(f"| {mark:g} s | {s.relative_distance:.2g} | {sent_kb:.1f} | {rounds:.0f} |")


if __name__ == "__main__":
    main()
