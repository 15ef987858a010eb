"""Robust mixing against one insider, with real node processes (``murmur swarm``): the honest
nodes' final accuracy and evictions for each attack, against a clean swarm, in one run.

    python -m bench.byzantine_procs [--nodes 4] [--steps 600] [--alpha 0.5|iid]
        [--attacks scale,flip,...] [--seeds 0,1,...] [--codec int8]
        [--insecure] [--slowdown K]

The last node (``--attack NAME``, as ``murmur swarm`` deals it) publishes harmful but valid
deltas; every other node runs ``--robust``. Accuracy is each node's final evaluation on the
shared held-out set (``report.json``); evictions are the honest nodes' ``evicting <id> from the
mix`` log lines, split by whether the evicted neighbour is the attacker, and "to evict" is the
median time from the attacker's start of training to each honest node's first eviction of it.
With several ``--seeds`` each row is a swarm per seed: accuracies are their worst and mean,
evictions their sums. ``--attacks ''`` runs the clean rows alone; ``--slowdown K`` makes the
first node K times slower (an honest straggler, which trains on after the others have
finished). The clean rows run the same swarm with no attacker, with robust and with plain
mixing. With Dirichlet shards (``--alpha 0.5``, ``murmur swarm``'s default) the honest nodes
never learn the attacker's shard, which costs accuracy of its own; with ``--alpha iid`` a
missing quarter of the data costs little, so the gap to the clean rows is the attack's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gossip.robust import ATTACKS
from node.cli.swarm import SwarmConfig, run_swarm
from node.config import GossipConfig


@dataclass
class Outcome:
    honest: list[float]  # each honest node's final accuracy
    of_honest: int  # evictions of honest neighbours
    of_attacker: int
    to_evict_s: list[float]  # from the attacker's start to each honest node's first eviction


def logged_at(line: str) -> datetime:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def run(
    workdir: Path,
    nodes: int,
    steps: int,
    alpha: float | None,
    robust: bool,
    attack: str | None,
    seed: int = 0,
    codec: str = "int8",
    insecure: bool = False,
    slowdown: float = 1.0,
) -> Outcome:
    cfg = SwarmConfig(
        nodes=nodes,
        seed=seed,
        alpha=alpha,
        steps=steps,
        eval_every=steps // 3,
        workdir=workdir,
        baseline=False,
        progress=False,
        gossip=GossipConfig(codec=codec, robust=robust, attack=attack),
        insecure=insecure,
        slowdowns={0: slowdown} if slowdown != 1 else {},
    )
    if asyncio.run(run_swarm(cfg)) != 0:
        raise SystemExit(f"the swarm in {workdir} failed")
    report = json.loads((workdir / "report.json").read_text())
    attacker = nodes - 1 if attack else None
    ids = [
        json.loads((workdir / f"node-{i}" / "summary.json").read_text())["node_id"]
        for i in range(nodes)
    ]
    honest = [n["accuracy"] for n in report["nodes"] if n["shard"] != attacker]
    started = None
    if attacker is not None:
        lines = (workdir / f"node-{attacker}" / "node.log").read_text().splitlines()
        started = next(logged_at(line) for line in lines if "starts training" in line)
    out = Outcome(honest, 0, 0, [])
    for i in range(nodes):
        if i == attacker:
            continue
        first = None
        for line in (workdir / f"node-{i}" / "node.log").read_text().splitlines():
            if "evicting " not in line:
                continue
            evicted = line.split("evicting ", 1)[1].split(" ", 1)[0]
            if attacker is not None and evicted == ids[attacker]:
                out.of_attacker += 1
                first = first or logged_at(line)
            else:
                out.of_honest += 1
        if first is not None and started is not None:
            out.to_evict_s.append((first - started).total_seconds())
    return out


def row(name: str, outcomes: list[Outcome]) -> str:
    honest = [a for o in outcomes for a in o.honest]
    waits = [s for o in outcomes for s in o.to_evict_s]
    wait = f"{statistics.median(waits):.2f}" if waits else "-"
    of_honest = sum(o.of_honest for o in outcomes)
    of_attacker = sum(o.of_attacker for o in outcomes)
    return (
        f"| {name} | {min(honest):.3f} | {statistics.mean(honest):.3f} "
        f"| {of_honest} / {of_attacker} | {wait} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--alpha", default="0.5", help="Dirichlet concentration, or iid")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--seeds", default="0", help="one swarm per seed for each row")
    parser.add_argument("--codec", default="int8", help="every node's --compress")
    parser.add_argument("--insecure", action="store_true", help="plain TCP instead of mTLS")
    parser.add_argument("--slowdown", type=float, default=1.0, help="the first node's")
    args = parser.parse_args()
    alpha = None if args.alpha == "iid" else float(args.alpha)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = [
        "| run | worst honest | mean honest | honest / attacker evictions | to evict, s |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="murmur-byz-") as tmp:
        runs: list[tuple[bool, str | None]] = [(False, None), (True, None)]
        runs += [(True, a) for a in args.attacks.split(",") if a]
        for k, (robust, attack) in enumerate(runs):
            outcomes = [
                run(
                    Path(tmp) / f"{k}-{seed}",
                    args.nodes,
                    args.steps,
                    alpha,
                    robust,
                    attack,
                    seed,
                    args.codec,
                    args.insecure,
                    args.slowdown,
                )
                for seed in seeds
            ]
            name = f"`{attack}`, 1 of {args.nodes}" if attack else "clean"
            rows.append(row(f"{name}, {'`--robust`' if robust else 'plain mixing'}", outcomes))
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
