"""One straggler five times slower: murmur against all-reduce, each as a ratio to its own run
without the straggler, all four runs in the same invocation.

    python -m bench.stragglers [--nodes 8] [--steps 600] [--step-time 0.02] [--slowdown 5]
        [--max-local-steps H]

Every node (or all-reduce worker) emulates a device whose step takes ``--step-time`` seconds
(``murmur run --step-time``), so that eight of them on a two-core machine each keep their own
pace instead of sharing the cores; the last one is ``--slowdown`` times slower. Throughput is the
swarm's total: the sum over nodes of samples per second while each trains. Accuracy is each
node's own evaluation when its step budget is spent (for all-reduce, the one shared model).
How murmur's local steps between rounds adapted is shown too: each node's steps over the rounds
it made while it trained, and the seconds it was held at ``--max-local-steps``; with that flag
given, a fifth run is murmur with the straggler and the bound.
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
from node.daemon.statedir import METRICS_FILE
from node.telemetry.events import read_metrics


def steps_per_round(state_dir: Path) -> float:
    """A node's steps over the rounds it made while it trained: at its last evaluation within
    the budget (afterwards it makes idle rounds only)."""
    evals = [r for r in read_metrics(state_dir / METRICS_FILE) if r["event"] == "eval"]
    last = [r for r in evals if not r["after_budget"]][-1]
    return float(last["step"]) / max(1, int(last["rounds"]))


async def murmur_run(cfg: SwarmConfig, workdir: Path) -> dict[str, Any]:
    summaries = await train_to_the_end(cfg, workdir, together=True)
    dirs = [workdir / f"node-{i}" for i in range(cfg.nodes)]
    report = await asyncio.to_thread(evaluate_run, dirs, cfg.task, cfg.seed, "cpu")
    return {
        "samples_per_s": sum(s["samples_per_s"] for s in summaries),
        "rates": [s["samples_per_s"] for s in summaries],
        "accuracy": [n.trained_accuracy for n in report.nodes],
        "averaged": report.averaged_accuracy,
        "per_round": [steps_per_round(d) for d in dirs],
        "held_s": [s["held_s"] for s in summaries],
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
    parser.add_argument("--max-local-steps", type=int, default=None)
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
        if args.max_local_steps is not None:
            bounded = dataclasses.replace(swarm.gossip, max_local_steps=args.max_local_steps)
            runs["murmur, bounded", True] = await murmur_run(
                dataclasses.replace(swarm, slowdowns=straggler, gossip=bounded),
                Path(tmp) / "murmur-bounded",
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
    print(
        "\n| murmur run | steps/round, fast (max) | steps/round, straggler | held s, fast (max) |"
    )
    print("|---|---:|---:|---:|")
    for key, r in runs.items():
        if "per_round" in r:
            name = f"{key[0]}, {'one straggler' if key[1] else 'no straggler'}"
            fast, held = r["per_round"][:-1], r["held_s"][:-1]
            print(
                f"| {name} | {statistics.mean(fast):.2f} ({max(fast):.2f}) | "
                f"{r['per_round'][-1]:.2f} | {statistics.mean(held):.1f} ({max(held):.1f}) |"
            )
    if ("murmur, bounded", True) in runs:
        r = runs["murmur, bounded", True]
        print(
            f"\nmurmur with the straggler and --max-local-steps {args.max_local_steps}: "
            f"{r['samples_per_s']:.0f} samples/s, fast nodes' accuracy (min) "
            f"{min(r['accuracy'][:-1]):.3f}, straggler {r['accuracy'][-1]:.3f}, "
            f"averaged {r['averaged']:.3f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
