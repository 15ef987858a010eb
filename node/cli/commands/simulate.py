"""``murmur simulate``: a swarm of N nodes in one process on a discrete-event clock
(node/sim/ runs it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from node.cli.commands.shared import (
    TASK_HELP,
    HelpFormatter,
    add_gossip_flags,
    add_regions_flag,
    fail,
    gossip_config,
    lacks_extra,
)

__all__ = ["add_parser", "cmd_simulate"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``murmur simulate`` to ``sub``."""
    p = sub.add_parser(
        "simulate",
        parents=[common],
        formatter_class=HelpFormatter,
        help="simulate a swarm of N nodes in one process on a discrete-event clock",
        description="The daemon's gossip core (codecs, replicas, mixing, topology, SWIM, link "
        "policy, trainer step) on a modelled network: latency, bandwidth, loss, stragglers "
        "and churn. Writes sim.jsonl and sim.png to --out. A node steps every --step-time "
        "simulated seconds and gossips at least --local-steps steps apart, when its links "
        "are not busy: the gossip period is about their product, or the links' round trip.",
    )
    p.add_argument("--nodes", type=int, default=64, metavar="N", help="simulated nodes")
    p.add_argument(
        "--duration", type=float, default=60.0, metavar="SECONDS", help="simulated seconds"
    )
    p.add_argument(
        "--task",
        default="logistic",
        metavar="TASK",
        help=f"{TASK_HELP} (logistic is the cheap one)",
    )
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha (non-iid shards)")
    p.add_argument("--iid", action="store_true", help="iid shards instead of Dirichlet")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the swarm's seed")
    p.add_argument(
        "--independent-init",
        action="store_true",
        help="every node starts from a model of its own (to measure consensus from afar)",
    )
    p.add_argument(
        "--step-time",
        type=float,
        default=0.02,
        metavar="SECONDS",
        help="simulated seconds per local step",
    )
    p.add_argument(
        "--steps", type=int, metavar="N", help="local step budget per node (default: no limit)"
    )
    p.add_argument(
        "--stragglers", type=float, default=0.0, metavar="F", help="fraction of slow nodes"
    )
    p.add_argument(
        "--straggler-slowdown", type=float, default=5.0, metavar="X", help="how much slower"
    )
    p.add_argument(
        "--speed-spread",
        type=float,
        default=0.0,
        metavar="SIGMA",
        help="sigma of a lognormal step-time factor",
    )
    p.add_argument(
        "--latency",
        type=float,
        nargs=2,
        default=(0.01, 0.05),
        metavar=("MIN", "MAX"),
        help="one-way delay of each link, uniform in [MIN, MAX] seconds",
    )
    p.add_argument(
        "--bandwidth", type=float, default=10.0, metavar="MBIT", help="uplink Mbit/s per node"
    )
    p.add_argument(
        "--loss", type=float, default=0.0, metavar="P", help="loss of deltas and SWIM messages"
    )
    p.add_argument(
        "--partition",
        metavar="AT:FOR[:GROUPS]",
        help="split the network into GROUPS (2) groups at AT simulated seconds for FOR seconds",
    )
    p.add_argument(
        "--churn",
        type=float,
        metavar="F",
        help="fraction of nodes replaced per simulated minute (half leave, half crash)",
    )
    p.add_argument(
        "--leave-rate", type=float, default=0.0, metavar="F", help="fraction leaving per minute"
    )
    p.add_argument(
        "--crash-rate", type=float, default=0.0, metavar="F", help="fraction crashing per minute"
    )
    p.add_argument(
        "--join-rate", type=float, default=0.0, metavar="F", help="fraction joining per minute"
    )
    p.add_argument(
        "--swim-period",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="membership period in seconds",
    )
    p.add_argument(
        "--eval-every",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="simulated seconds between samples",
    )
    p.add_argument(
        "--consensus-threshold",
        type=float,
        metavar="D",
        default=1e-2,
        help="relative consensus distance counted as consensus",
    )
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=0.8,
        metavar="ACC",
        help="accuracy counted as reached",
    )
    p.add_argument(
        "--target-loss",
        type=float,
        metavar="LOSS",
        help="eval loss counted as reached, for tasks judged by loss (default: the task's)",
    )
    p.add_argument(
        "--attackers",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="testing robustness: share of the nodes that publish --attack (scale, flip, "
        "random, huge, spike) instead of their model (samples count the honest nodes only)",
    )
    p.add_argument(
        "--behind-nat",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of the nodes that nobody can dial: they name relays, and have only "
        "neighbours others can dial",
    )
    p.add_argument(
        "--paused-fraction",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of the nodes paused at any moment, on average (battery, heat, off AC): "
        "each alternates between running and paused, as the daemon pauses",
    )
    p.add_argument(
        "--pause-mean",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="mean length of one pause, in simulated seconds",
    )
    p.add_argument(
        "--budgeted-fraction",
        type=float,
        default=1.0,
        metavar="SHARE",
        help="share of the nodes that --byte-budget applies to (metered links)",
    )
    p.add_argument("--out", type=Path, default=Path("murmur-sim"), metavar="DIR", help="output dir")
    p.add_argument("--quiet", action="store_true", help="no progress")
    add_gossip_flags(p, suppress=False)
    add_regions_flag(p)
    p.add_argument(
        "--cross-region-slowdown",
        type=float,
        default=10.0,
        metavar="X",
        help="with --regions: links between two regions are X times slower (delay and rate)",
    )
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Simulate; exit 2 on a refused flag or a missing extra."""
    if lacks_extra("simulate", "matplotlib", "plots"):
        return 2
    import torch

    from gossip.swim import SwimConfig
    from node.sim.config import ChurnConfig, NetConfig, PartitionConfig, SimConfig
    from node.sim.run import run_simulation

    try:
        gossip = gossip_config(args)
        churn = (
            ChurnConfig.replacing(args.churn)
            if args.churn is not None
            else ChurnConfig(args.leave_rate, args.crash_rate, args.join_rate)
        )
        cfg = SimConfig(
            nodes=args.nodes,
            task=args.task,
            alpha=None if args.iid else args.alpha,
            seed=args.seed,
            independent_init=args.independent_init,
            step_time_s=args.step_time,
            stragglers=args.stragglers,
            straggler_slowdown=args.straggler_slowdown,
            speed_spread=args.speed_spread,
            steps=args.steps,
            duration_s=args.duration,
            eval_every_s=args.eval_every,
            consensus_threshold=args.consensus_threshold,
            target_accuracy=args.target_accuracy,
            target_loss=args.target_loss,
            attackers=args.attackers,
            paused_fraction=args.paused_fraction,
            pause_mean_s=args.pause_mean,
            budgeted_fraction=args.budgeted_fraction,
            gossip=gossip,
            membership=SwimConfig(period_s=args.swim_period),
            net=NetConfig(
                tuple(args.latency),
                args.bandwidth * 1e6 / 8,
                args.loss,
                PartitionConfig.parse(args.partition) if args.partition else None,
                args.behind_nat,
                args.regions,
                args.cross_region_slowdown,
            ),
            churn=churn,
        )
    except ValueError as err:
        return fail("simulate", err)
    torch.set_num_threads(1)  # thousands of tiny models: intra-op threads only contend
    run_simulation(cfg, args.out, None if args.quiet else sys.stdout)
    return 0
