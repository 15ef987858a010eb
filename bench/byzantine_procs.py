"""Robust mixing against one insider, with real node processes (``murmur swarm``): the honest
nodes' final accuracy and evictions for each attack, against a clean swarm, in one run.

    python -m bench.byzantine_procs [--nodes 4] [--steps 600] [--alpha 0.5|iid]
        [--attacks scale,flip,...]

The last node (``--attack NAME``, as ``murmur swarm`` deals it) publishes harmful but valid
deltas; every other node runs ``--robust``. Accuracy is each node's final evaluation on the
shared held-out set (``report.json``); evictions are the honest nodes' ``evicting <id> from the
mix`` log lines, split by whether the evicted neighbour is the attacker. The clean rows run the
same swarm with no attacker, with robust and with plain mixing. With Dirichlet shards
(``--alpha 0.5``, ``murmur swarm``'s default) the honest nodes never learn the attacker's shard,
which costs accuracy of its own; with ``--alpha iid`` a missing quarter of the data costs little,
so the gap to the clean rows is the attack's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from gossip.robust import ATTACKS
from node.cli.swarm import SwarmConfig, run_swarm
from node.config import GossipConfig


def run(
    workdir: Path, nodes: int, steps: int, alpha: float | None, robust: bool, attack: str | None
) -> str:
    cfg = SwarmConfig(
        nodes=nodes,
        alpha=alpha,
        steps=steps,
        eval_every=steps // 3,
        workdir=workdir,
        baseline=False,
        progress=False,
        gossip=GossipConfig(codec="int8", robust=robust, attack=attack),
    )
    if asyncio.run(run_swarm(cfg)) != 0:
        raise SystemExit(f"the swarm in {workdir} failed")
    report = json.loads((workdir / "report.json").read_text())
    attacker = nodes - 1 if attack else None
    ids = [
        json.loads((workdir / f"node-{i}" / "summary.json").read_text())["node_id"]
        for i in range(nodes)
    ]
    honest = sorted(n["accuracy"] for n in report["nodes"] if n["shard"] != attacker)
    of_honest = of_attacker = 0
    for i in range(nodes):
        if i == attacker:
            continue
        for line in (workdir / f"node-{i}" / "node.log").read_text().splitlines():
            if "evicting " not in line:
                continue
            evicted = line.split("evicting ", 1)[1].split(" ", 1)[0]
            if attacker is not None and evicted == ids[attacker]:
                of_attacker += 1
            else:
                of_honest += 1
    name = f"`{attack}`, 1 of {nodes}" if attack else "clean"
    mixing = "`--robust`" if robust else "plain mixing"
    mean = sum(honest) / len(honest)
    return f"| {name}, {mixing} | {honest[0]:.3f} | {mean:.3f} | {of_honest} / {of_attacker} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--alpha", default="0.5", help="Dirichlet concentration, or iid")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    args = parser.parse_args()
    alpha = None if args.alpha == "iid" else float(args.alpha)
    rows = [
        "| run | worst honest | mean honest | honest / attacker evictions |",
        "|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="murmur-byz-") as tmp:
        runs: list[tuple[bool, str | None]] = [(False, None), (True, None)]
        runs += [(True, a) for a in args.attacks.split(",")]
        for k, (robust, attack) in enumerate(runs):
            rows.append(run(Path(tmp) / str(k), args.nodes, args.steps, alpha, robust, attack))
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
