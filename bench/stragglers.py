"""One straggler five times slower: murmur against all-reduce, each as a ratio to its own run
without the straggler, all four runs in the same invocation.

    python -m bench.stragglers [--nodes 8] [--steps 600] [--step-time 0.02] [--slowdown 5]

Every node (or all-reduce worker) emulates a device whose step takes ``--step-time`` seconds
(``murmur run --step-time``), so that eight of them on a two-core machine each keep their own
pace instead of sharing the cores; the last one is ``--slowdown`` times slower. Throughput is the
swarm's total: the sum over nodes of samples per second while each trains. Accuracy is each
node's own evaluation when its step budget is spent (for all-reduce, the one shared model).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.allreduce import AllReduceConfig, run_allreduce
from bench.swarms import train_to_the_end
from node.cli.evaluation import evaluate_run
from node.cli.swarm import SwarmConfig
from node.config import GossipConfig


async def murmur_run(cfg: SwarmConfig, workdir: Path) -> dict[str, Any]:
    summaries = await train_to_the_end(cfg, workdir, together=True)
    dirs = [workdir / f"node-{i}" for i in range(cfg.nodes)]
    report = await asyncio.to_thread(evaluate_run, dirs, cfg.task, cfg.seed, "cpu")
    return {
        "samples_per_s": sum(s["samples_per_s"] for s in summaries),
        "rates": [s["samples_per_s"] for s in summaries],
        "accuracy": [n.trained_accuracy for n in report.nodes],
        "averaged": report.averaged_accuracy,
    }


async def allreduce_run(cfg: AllReduceConfig, workdir: Path) -> dict[str, Any]:
    results = await run_allreduce(cfg, workdir)
    return {
        "samples_per_s": sum(r["samples_per_s"] for r in results),
        "rates": [r["samples_per_s"] for r in results],
        "accuracy": [r["evals"][-1]["accuracy"] for r in results],
        "averaged": results[0]["evals"][-1]["accuracy"],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--slowdown", type=float, default=5.0)
    parser.add_argument("--compress", default="int8")
    parser.add_argument("--target", type=float, default=0.93)
    args = parser.parse_args()
    straggler = {args.nodes - 1: args.slowdown}
    swarm = SwarmConfig(
        nodes=args.nodes,
        steps=args.steps,
        alpha=0.5,
        eval_every=100,
        step_time=args.step_time,
        gossip=GossipConfig(codec=args.compress),
        insecure=True,  # the cost of TLS is measured on its own
    )
    baseline = AllReduceConfig(
        world=args.nodes, steps=args.steps, alpha=0.5, eval_every=100, step_time=args.step_time
    )
    runs: dict[tuple[str, bool], dict[str, Any]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for slow in (False, True):
            s = straggler if slow else {}
            tag = "slow" if slow else "even"
            runs["murmur", slow] = await murmur_run(
                dataclasses.replace(swarm, slowdowns=s), Path(tmp) / f"murmur-{tag}"
            )
            runs["all-reduce", slow] = await allreduce_run(
                dataclasses.replace(baseline, slowdowns=s), Path(tmp) / f"ar-{tag}"
            )
    wall = time.monotonic() - t0
    print(
        f"# {args.nodes} nodes x {args.steps} steps, step time {args.step_time * 1000:.0f} ms, "
        f"last node {args.slowdown:g}x slower, murmur {args.compress} ({wall:.0f} s in all)"
    )
    print(
        "| system | samples/s, no straggler | samples/s, one straggler | ratio | "
        "fast nodes' accuracy (min) | straggler's accuracy | averaged model |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for system in ("murmur", "all-reduce"):
        even, lagging = runs[system, False], runs[system, True]
        fast_acc = min(lagging["accuracy"][:-1])
        print(
            f"| {system} | {even['samples_per_s']:.0f} | {lagging['samples_per_s']:.0f} | "
            f"{lagging['samples_per_s'] / even['samples_per_s']:.2f} | {fast_acc:.3f} | "
            f"{lagging['accuracy'][-1]:.3f} | {lagging['averaged']:.3f} |"
        )
    for system in ("murmur", "all-reduce"):
        rates = runs[system, True]["rates"]
        print(
            f"\n{system} with the straggler, samples/s per node: fast "
            f"{statistics.mean(rates[:-1]):.0f} (mean), straggler {rates[-1]:.0f}"
        )
        reached = sum(a >= args.target for a in runs[system, True]["accuracy"][:-1])
        print(f"{system}: {reached}/{args.nodes - 1} fast nodes reached {args.target}")


if __name__ == "__main__":
    asyncio.run(main())
