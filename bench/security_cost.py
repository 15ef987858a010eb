"""What mutual TLS and robust mixing cost: per-node step rate and gossip throughput, as ratios to
the same swarm with both off, in the same run.

    python -m bench.security_cost [--nodes 4] [--steps 1500] [--repeats 2] [--compress int8]

Each configuration starts the same number of real node processes on this machine (so they compete
for the same cores), joined into one swarm over gRPC on loopback: plain TCP without robust mixing
(the baseline), mTLS, robust mixing (ClippedGossip), and both. The configurations run in turn,
``--repeats`` times, alternating, so that a drift of the machine's load hits all of them alike.
A node's step rate is its steps over the wall time of its training (from the summary it writes
when stopped); its gossip throughput is rounds and bytes sent per second of that time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from bench.swarms import train_to_the_end
from node.cli.swarm import SwarmConfig
from node.config import GossipConfig
from node.tasks import Shard, load_task

CONFIGS = {
    "plain": {"insecure": True, "robust": False},
    "mTLS": {"insecure": False, "robust": False},
    "robust": {"insecure": True, "robust": True},
    "mTLS + robust": {"insecure": False, "robust": True},
}


async def run_swarm(cfg: SwarmConfig, workdir: Path, batch: int) -> list[dict[str, float]]:
    out = []
    for summary in await train_to_the_end(cfg, workdir, together=True):
        seconds = summary["step"] * batch / summary["samples_per_s"]
        out.append(
            {
                "steps_per_s": summary["step"] / seconds,
                "rounds_per_s": summary["rounds"] / seconds,
                "bytes_per_s": summary["bytes_sent"] / seconds,
            }
        )
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compress", default="int8")
    args = parser.parse_args()
    batch = load_task("digits")(Shard()).batch_size
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, setting in CONFIGS.items():
                cfg = SwarmConfig(
                    nodes=args.nodes,
                    steps=args.steps,
                    eval_every=10**9,
                    insecure=setting["insecure"],
                    gossip=GossipConfig(codec=args.compress, robust=setting["robust"]),
                )
                workdir = Path(tmp) / f"{repeat}-{name.replace(' ', '')}"
                results[name] += await run_swarm(cfg, workdir, batch)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print(f"{args.nodes} nodes x {args.steps} steps, {args.compress}, {args.repeats} repeats")
    print("| config | steps/s | ratio | rounds/s | ratio | KB sent/s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = {k: median("plain", k) for k in ("steps_per_s", "rounds_per_s", "bytes_per_s")}
    for name in CONFIGS:
        cells = []
        for key in ("steps_per_s", "rounds_per_s", "bytes_per_s"):
            value = median(name, key)
            shown = value / 1e3 if key == "bytes_per_s" else value
            cells += [f"{shown:.1f}", f"{value / base[key]:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    asyncio.run(main())
