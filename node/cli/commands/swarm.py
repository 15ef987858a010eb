"""``murmur swarm``: N real node processes on this machine, then a report (node/cli/swarm.py
runs them)."""

from __future__ import annotations

import argparse
import asyncio
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

__all__ = ["add_parser", "cmd_swarm"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``murmur swarm`` to ``sub``."""
    p = sub.add_parser(
        "swarm",
        parents=[common],
        formatter_class=HelpFormatter,
        help="run N real nodes on this machine and report",
    )
    p.add_argument("--nodes", type=int, default=8, metavar="N", help="node processes to run")
    p.add_argument("--steps", type=int, default=600, metavar="N", help="local steps per node")
    p.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long in any case"
    )
    p.add_argument("--task", default="digits", metavar="TASK", help=TASK_HELP)
    p.add_argument(
        "--alpha", type=float, default=0.5, metavar="A", help="Dirichlet alpha (non-iid shards)"
    )
    p.add_argument("--iid", action="store_true", help="iid shards instead of Dirichlet")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the swarm's seed")
    p.add_argument("--device", default="cpu", metavar="DEVICE", help="every node's device")
    p.add_argument(
        "--eval-every", type=int, default=100, metavar="N", help="evaluate every N steps"
    )
    p.add_argument(
        "--settle-rounds",
        type=int,
        metavar="N",
        default=20,
        help="gossip rounds every node does after the last one finishes training (a node "
        "that falls quiet first, with the event-triggered rule, counts as settled)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="where state dirs and the report go (default: murmur-runs/TIME)",
    )
    p.add_argument(
        "--no-baseline", action="store_true", help="skip training the single-process reference"
    )
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.add_argument(
        "--insecure", action="store_true", help="plain TCP between the nodes instead of mTLS"
    )
    add_gossip_flags(p, suppress=False)
    add_regions_flag(p)
    p.set_defaults(func=cmd_swarm)


def cmd_swarm(args: argparse.Namespace) -> int:
    """Run the swarm and its report; exit 2 on a refused flag or a missing extra."""
    if lacks_extra("swarm", "matplotlib", "plots", "murmur swarm (its report)"):
        return 2
    from node.cli.swarm import SwarmConfig, run_swarm

    try:
        gossip = gossip_config(args)
        cfg = SwarmConfig(
            nodes=args.nodes,
            steps=args.steps,
            duration_s=args.duration,
            task=args.task,
            alpha=None if args.iid else args.alpha,
            seed=args.seed,
            device=args.device,
            eval_every=args.eval_every,
            settle_rounds=args.settle_rounds,
            workdir=args.workdir,
            baseline=not args.no_baseline,
            insecure=args.insecure,
            regions=args.regions,
            progress=not args.quiet,
            gossip=gossip,
        )
    except ValueError as err:
        return fail("swarm", err)
    return asyncio.run(run_swarm(cfg))
